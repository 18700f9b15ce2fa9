"""Moving a module's parameters to and from a turbine device without replacing them.

torch moves parameters (``module.to``, ``.cpu()``, ``.half()``) in ``Module._apply``, in one of
three ways. For a parameter two modules share (GPT-2's ``lm_head.weight is wte.weight``) only two
keep it shared, because they change the Parameter object in place rather than making a new one
for each module:

- ``torch.utils.swap_tensors(param, new)``, taken when the new value is a traceable wrapper
  subclass. CPU to turbine goes this way: a tensor moved by ``Tensor.to`` is marked traceable
  (:func:`mark_for_swap`) when the CPU tensor can be swapped, i.e. nothing else holds it (an
  autograd graph still alive would; such a move makes new parameters, as before).
- ``param.data = new``, taken when ``torch._has_compatible_shallow_copy_type`` says yes, which
  turbine's dispatch says for a turbine parameter and a turbine or CPU value: turbine to turbine
  (``.half()``, another device) keeps the object and takes the new storage, and turbine to CPU
  turns the object back into a CPU tensor (:func:`leave_device`).

The mark is set on the tensor ``Tensor.to`` returns; ``Module._apply`` swaps a detached alias of
it into the parameter, so parameters never carry it.
"""

from __future__ import annotations

import sys
import warnings
import weakref

import torch

#: Attributes of a turbine tensor that say where its values are (eager/tensor.py).
_DEVICE_ATTRIBUTES = ("_storage", "_dense", "_key", "_view_cache")


def mark_for_swap(source: torch.Tensor, moved: torch.Tensor) -> None:
    """Let ``Module._apply`` swap ``moved`` into ``source`` when torch.utils.swap_tensors can.

    ``swap_tensors`` refuses a tensor that anything else references (its use count above one: an
    autograd graph that saved it, a view of it) or that has weak references.
    """
    if not (isinstance(source, torch.nn.Parameter) and _moved_by_module_apply()):
        return
    if source._use_count() == 1 and not weakref.getweakrefs(source):
        moved.__dict__["__tensor_flatten__"] = _no_inner_tensors
    elif isinstance(source, torch.nn.Parameter) and not _warned:
        _warned.append(True)
        warnings.warn(
            "turbine: a parameter moved to a turbine device is referenced elsewhere (by an autograd graph "
            "still alive, say the output of a forward pass on the CPU), so module.to() gives the module new "
            "parameters, and parameters shared between modules (tied embeddings) stop being shared. Move the "
            "module before running it, or delete the outputs that hold its graph first.",
            UserWarning,
            stacklevel=5,
        )


_warned: list[bool] = []  # the warning above, once per process

_APPLY = torch.nn.Module._apply.__code__


def _moved_by_module_apply() -> bool:
    """Whether ``Module._apply`` (``module.to``) asked for this move of a parameter: only its
    swaps need the mark (it assigns buffers), and any other tensor keeping it would look
    traceable to torch.compile, which then failed inside dynamo where it breaks its graph for a
    turbine tensor (eager/dynamo_rules.py). Its frame is somewhere above (a module's own
    ``_apply`` may call it, and a compiled function's eager part adds frames)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _APPLY:
            return True
        frame = frame.f_back
    return False


def _no_inner_tensors() -> tuple[list[str], None]:
    """A turbine tensor's values live in an IREE buffer, not in inner torch tensors."""
    return [], None


def leave_device(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """``tensor.data = value`` for a turbine ``tensor`` and a CPU ``value``: the Python object
    becomes a CPU tensor (or Parameter) over ``value``'s storage, its other attributes and
    ``requires_grad`` kept, its gradient copied to the CPU with it.

    The C++ tensor behind the object is swapped for a detached alias of ``value``; the alias
    object takes the turbine tensor that was there.
    """
    grad = tensor.grad
    if grad is not None:
        tensor.grad = None
    device_class = type(tensor)
    moved = {name: tensor.__dict__.pop(name) for name in _DEVICE_ATTRIBUTES if name in tensor.__dict__}
    is_param = tensor.__dict__.pop("_is_param", False)
    alias = value.detach()
    alias.requires_grad_(tensor.requires_grad)
    torch._C._swap_tensor_impl(tensor, alias)
    tensor.__class__ = torch.nn.Parameter if is_param else torch.Tensor
    alias.__class__ = device_class
    alias.__dict__.update(moved)
    if grad is not None:
        tensor.grad = grad.cpu()
