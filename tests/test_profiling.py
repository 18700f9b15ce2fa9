"""turbine.profile(): a per-op table of a block's ops; turbine.stats() in a notebook (issue 19, item 5)."""

from __future__ import annotations

import torch

import turbine
from checks import D


def test_a_profile_counts_each_op_the_block_called(fresh_cache):
    x = torch.randn(8, 16).to(D)
    w = torch.randn(16, 4).to(D)
    with turbine.override(background_compile=False):
        (x @ w).cpu()  # compiled before the profile
        with turbine.profile() as profile:
            for _ in range(3):
                y = torch.tanh(x @ w)  # tanh is new: compiled inside the profile
            y.sum()
    rows = profile.rows
    assert rows["aten.mm.default"].calls == 3 and rows["aten.tanh.default"].calls == 3
    assert rows["aten.mm.default"].compiles == 0 and rows["aten.tanh.default"].compiles == 1
    assert rows["aten.tanh.default"].compile_s > 0
    assert rows["aten.mm.default"].executors == {"iree": 3}
    assert all(row.fallbacks == 0 for row in rows.values())
    assert all(row.total_s >= row.host_s >= 0 for row in rows.values())
    table = str(profile)
    assert table.splitlines()[0].split()[:3] == ["op", "calls", "total"]
    assert "aten.tanh.default" in table and "<td>aten.mm.default</td>" in profile._repr_html_()


def test_a_profile_counts_fallbacks_and_ops_outside_it_not_at_all(fresh_cache):
    x = torch.rand(4, 6).to(D)
    with turbine.profile() as profile:
        with turbine.fallback("device"):
            torch.special.airy_ai(x).cpu()  # IREE cannot compile it: the fallback runs it
    torch.exp(x).cpu()
    assert profile.rows["aten.special_airy_ai.default"].fallbacks == 1
    assert "aten.exp.default" not in profile.rows
    from turbine.eager.tensor import DeviceTensor

    assert not hasattr(DeviceTensor.dispatcher, "unprofiled")  # the profile is off again


def test_stats_render_as_a_table_in_a_notebook():
    html = turbine.stats()._repr_html_()
    assert html.startswith("<table>") and "<td>kernels_compiled</td>" in html
    assert isinstance(turbine.stats(), dict)
