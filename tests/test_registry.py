"""The op registry (eager/registry.py): one entry per op, read by dispatch, and explained."""

from __future__ import annotations

import pytest
import torch

from turbine.__main__ import main
from turbine.eager import dispatch, registry
from turbine.eager.explain import explain, resolve

aten = torch.ops.aten


def test_every_declared_handler_is_the_route_its_op_takes():
    handled = [op for op, entry in registry.entries().items() if entry.handler is not None]
    assert aten._to_copy.default in handled and aten.bernoulli_.float in handled
    for op in handled:
        assert dispatch.route_name(op).startswith("handler"), op


def test_an_op_declared_twice_for_one_part_is_refused():
    with pytest.raises(ValueError, match="two corrections"):
        registry.declare(aten.sort.default, "a second correction", correction=lambda x: x)
    with pytest.raises(ValueError, match="unknown op trait"):
        registry.declare(aten.sort.default, "a typo", traits=["fast"])


def test_decompositions_come_from_torch_and_turbine_s_own_win():
    table = registry.decompositions()
    assert table[aten.hardswish.default] is torch._decomp.core_aten_decompositions()[aten.hardswish.default]
    own = registry.entry(aten.special_bessel_j0.default).decomposition
    assert own is not None and table[aten.special_bessel_j0.default] is own


def test_the_generic_way_reads_corrections_traits_and_foreground_compiles_from_the_registry():
    assert registry.correction(aten.pow.Tensor_Tensor) is not None
    assert registry.correction(aten.add.Tensor) is None
    assert registry.has_trait(aten.mm.default, "native_precision") and not registry.has_trait(aten.addmm.default, "native_precision")
    assert registry.has_trait(aten.clone.default, "same_elements")
    assert registry.compiles_in_foreground(aten._embedding_bag.default)


def test_explain_says_what_happens_to_an_op_and_why():
    sort = explain(resolve("aten.sort.default"))
    assert "correction" in sort and "NaNs" in sort and "IREE kernel" in sort
    in_place = explain(resolve("add_.Tensor"))
    assert "runs aten.add.Tensor and writes the results" in in_place and "alpha" in in_place
    assert "not in the op registry" in in_place
    random = explain(resolve("aten.bernoulli_.float"))
    assert "handler" in random and "seed" in random
    assert "composite" in explain(resolve("aten.linear"))
    assert "timed once per signature" in explain(resolve("aten.mm.default"))  # the vendor competes
    assert "timed once per signature" in explain(resolve("aten.add.Tensor"))  # every kernel op competes


def test_the_explain_command_names_a_bad_op_and_the_way_out(capsys):
    assert main(["explain", "aten.topk.default"]) == 0
    assert "integer key" in capsys.readouterr().out
    assert main(["explain", "aten.no_such_op"]) == 2
    assert "name an aten overload" in capsys.readouterr().err


def test_the_lowering_digest_is_the_same_in_every_process_and_follows_the_code():
    """Kernels (and remembered compile failures) of an op with turbine's own lowering are keyed by
    a digest of its code, so a changed lowering misses them: the LSTM cell's failure, cached before
    its decomposition existed, kept it failing."""
    import subprocess
    import sys

    aten = torch.ops.aten
    here = registry.lowering_digest(aten.scatter.src)
    code = "import torch, turbine; from turbine.eager import registry; print(registry.lowering_digest(torch.ops.aten.scatter.src))"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert here == there and len(here) == 16
    assert registry.lowering_digest(aten.add.Tensor) is None  # no lowering of turbine's own
    assert registry.lowering_digest(aten.scatter.src) != registry.lowering_digest(aten._thnn_fused_gru_cell.default)
    namespace: dict = {}
    exec("def lowering(x):\n    return x + 1\n", namespace)  # no source file to read: its compiled code counts
    assert registry._sources(namespace["lowering"]) != registry._sources(lambda x: x - 1)
    # a helper from another module of the package counts, and its helpers in turn (bessel -> gamma -> bits)
    package = "turbine.eager.decompositions"
    assert {f"{package}.gamma", f"{package}.bits", f"{package}._common"} <= registry._helper_modules(f"{package}.bessel")
    assert "turbine.eager.registry" not in registry._helper_modules(f"{package}.bessel")
    assert f"{package}.order" in registry._helper_modules("turbine.eager.ops.corrections")  # argmax's, through the package


def test_a_handlers_rewritten_arguments_go_on_in_atens_positions():
    """A handler reads and rewrites arguments by name and hands them on positionally: torch's
    Python decompositions take aten's positions but not always its names (``input`` for
    ``self``: multilabel_margin_loss fell back when its checked target came back by name)."""
    from turbine.eager.schema import as_call, bound_arguments

    aten = torch.ops.aten
    named = bound_arguments(aten.gather.default, (1, 0), {"index": 2, "sparse_grad": True})
    assert named == {"self": 1, "dim": 0, "index": 2, "sparse_grad": True}
    assert as_call(aten.gather.default, named | {"index": 3}) == ((1, 0, 3), {"sparse_grad": True})
    # a gap before a given argument takes the schema's default; keyword-only ones stay keywords
    assert as_call(aten._grouped_mm.default, {"self": 1, "mat2": 2, "bias": 4}) == ((1, 2, None, 4), {})
    assert as_call(aten.repeat_interleave.Tensor, {"repeats": 1, "output_size": 6}) == ((1,), {"output_size": 6})
