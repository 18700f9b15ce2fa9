"""turbine beside torch.compile: of turbine's code, dynamo traces the function mode's first checks.

After ``import turbine`` every torch call in the process passes turbine's function mode
(eager/mode.py), and dynamo traces a function mode's handler as part of the function it
compiles. Three rules keep the two apart:

- The handler answers at once while dynamo traces (``torch.compiler.is_dynamo_compiling``), so a
  model on torch's own devices compiles to the graphs it gets without turbine. The rest of the
  handler, which dynamo cannot trace, had made it give up on every frame: torch.compile silently
  ran everything eagerly. A call that names a turbine device breaks the graph there.
- A compiled function that meets a turbine tensor breaks its graph there and runs the op eagerly
  (dynamo cannot trace a tensor that lives in IREE's buffers). turbine's handling of that op then
  runs with dynamo's frame callback off (:data:`outside_dynamo`, which runs the handler's body,
  not its entry, so a callback left on inside cannot loop back here): with it on, dynamo compiled
  turbine's frames one by one, and those of IREE's compiler below them, with turbine's caches
  and queues as their guards. The first such op warns that the function runs eagerly on turbine.
- Every other turbine module is on dynamo's skip list, so dynamo does not try them as frames.
"""

from __future__ import annotations

import logging
import pkgutil
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

logger = logging.getLogger("turbine")

#: The modules dynamo must trace: the function mode, whose handler it inlines into every graph.
TRACED = frozenset({"turbine.eager.mode"})

#: dynamo's frame callback on this thread: None outside a function torch.compile compiled.
_frame_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback

_warned = False


def in_compiled_function() -> bool:
    """Whether this thread runs the eager part of a function torch.compile compiled (where
    dynamo checks every frame that starts, to compile it)."""
    return _frame_callback() is not None


def _eagerly(fn: Callable, *args: Any, turbine_tensors: bool = True) -> Any:
    """``fn(*args)``, run by :data:`outside_dynamo`; ``turbine_tensors`` says the call handles
    turbine tensors (the first warns)."""
    global _warned
    if turbine_tensors and not _warned:
        _warned = True
        warnings.warn(
            "torch.compile does not compile ops on turbine tensors: they run eagerly, op by op, inside "
            "the compiled function (turbine.graphed captures a whole step on a GPU)",
            stacklevel=4,
        )
    return fn(*args)


#: ``fn(*args, turbine_tensors=...)`` with dynamo's frame callback off (``torch.compiler.disable``).
#: Called from the mode's handler, which dynamo traces: there it breaks the graph, and under
#: ``fullgraph=True`` dynamo's error quotes the reason.
outside_dynamo = torch.compiler.disable(
    _eagerly,
    recursive=True,
    reason="turbine runs this call eagerly: it names a turbine device or has a turbine tensor, which "
    "torch.compile cannot put in a graph (without fullgraph=True the graph breaks here)",
)


def keep_dynamo_out(handler: Callable) -> None:
    """Put every turbine module but the function mode's (the packages that hold no traced module
    whole) on dynamo's skip list, and the mode's ``handler`` on its list of code never compiled
    as a frame of its own (dynamo still inlines it into the functions it compiles: without this
    it compiled the handler each time the eager part of a compiled function called it). Neither
    list is public API: where a torch lacks them, turbine says so and dynamo tries turbine's
    frames as it did before."""
    try:
        from torch._dynamo import eval_frame, trace_rules

        for name in _modules_to_skip():
            trace_rules.add(name)
        eval_frame.skip_code(handler.__code__)
    except (ImportError, AttributeError) as error:
        logger.warning("turbine could not keep torch.compile out of its own code (%s)", error)


def _modules_to_skip() -> list[str]:
    """turbine's modules and packages, a package whole where it holds no traced module."""
    found, packages = [], [(Path(__file__).resolve().parents[1], "turbine.")]
    while packages:
        path, prefix = packages.pop()
        for module in pkgutil.iter_modules([str(path)], prefix):
            if module.name in TRACED:
                continue
            if module.ispkg and any(name.startswith(module.name + ".") for name in TRACED):
                packages.append((path / module.name.rsplit(".", 1)[1], module.name + "."))
            else:
                found.append(module.name)
    return found
