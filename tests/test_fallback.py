"""Ops IREE cannot run go to the fallback policy: device (torch on the same memory), host, or error."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import turbine
from turbine.config import Config
from turbine.eager import runtime
from checks import D

POLICIES = ["device", "host"]


def fresh_warnings():
    runtime.state.warned.clear()


@pytest.mark.parametrize("policy", POLICIES)
def test_op_without_lowering_runs_under_each_policy(policy, stats):
    x = torch.rand(4, 6) * 4 - 2  # airy_ai: IREE 3.13 has no lowering for it, nor turbine a decomposition
    xd = x.to(D)
    uploads = stats()["host_transfers"]
    with turbine.fallback(policy):
        result = torch.special.airy_ai(xd)
    assert isinstance(result, turbine.DeviceTensor)
    moved = stats()["host_transfers"] - uploads
    assert moved == (0 if policy == "device" else 2)  # device: zero-copy; host: one down, one up
    torch.testing.assert_close(result.cpu(), torch.special.airy_ai(x))
    assert stats()["fallbacks"]["aten.special_airy_ai.default"] == 1
    assert stats()["executors"][{"device": "torch", "host": "host"}[policy]] == 1


def test_an_executor_that_fails_hands_the_op_to_the_next(monkeypatch, stats):
    """torch CUDA has no int64 matmul: under the device policy such an op goes on to host copies."""
    from turbine.eager import executors

    def no_kernel(*args, **kwargs):
        raise NotImplementedError('"addmm_cuda" not implemented for \'Long\' (injected)')

    monkeypatch.setattr(executors.TORCH, "run", no_kernel)
    x = torch.rand(3, 5) * 4 - 2
    fresh_warnings()
    with pytest.warns(turbine.TurbineFallbackWarning, match="torch's CPU kernel on host copies"):
        result = torch.special.airy_ai(x.to(D)).cpu()  # read: a background compile fails first
    torch.testing.assert_close(result, torch.special.airy_ai(x))
    assert stats()["executors"].get("host") == 1 and stats()["executors"].get("torch", 0) == 0
    monkeypatch.setattr(executors.HOST, "run", no_kernel)
    with pytest.raises(turbine.UnsupportedOpError, match="neither could torch's kernel .* nor torch's CPU kernel on host copies"):
        torch.special.airy_ai(x.to(D)).cpu()


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda d: torch.bincount(torch.tensor([1, -3], device=d)), "bincount only supports 1-d non-negative integral inputs"),
        (lambda d: torch.segment_reduce(torch.arange(6.0, device=d), "sum", lengths=torch.tensor([2, 9], device=d)), "to sum to data.size"),
    ],
    ids=["bincount", "segment_reduce"],
)
def test_torchs_refusal_of_the_calls_arguments_is_the_calls_error(call, words):
    """Ops IREE cannot run, given arguments torch's kernel refuses: the user gets torch's error,
    as on the CPU, not a turbine error saying that no executor could run the op."""
    with pytest.raises(RuntimeError, match=words) as cpu_error:
        call("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match=words) as ours:
            call(D).cpu()  # read: an op whose kernel is still compiling falls back when read
    assert type(ours.value) is type(cpu_error.value)


def test_a_sparse_result_says_turbine_holds_dense_tensors_and_the_way_out():
    """torch's kernels could make them, but turbine could not adopt them ("unsupported memory
    format option Contiguous", twice, under a message that named IREE)."""
    with pytest.raises(turbine.UnsupportedLayoutError, match="to_sparse.* gives a torch.sparse_coo tensor.*keep sparse tensors on the CPU"):
        torch.ones(3, device=D).to_sparse()
    embedding = torch.nn.Embedding(10, 4, sparse=True).to(D)
    with pytest.raises(turbine.UnsupportedLayoutError, match="sparse=False"):
        embedding(torch.tensor([1, 2], device=D)).sum().backward()
    dense = torch.nn.Embedding(10, 4).to(D)
    dense(torch.tensor([1, 2], device=D)).sum().backward()  # the device runs on
    assert dense.weight.grad.cpu()[1:3].eq(1).all()


def test_error_policy_names_the_op_and_the_way_out():
    with turbine.fallback("error"):
        with pytest.raises(turbine.UnsupportedOpError, match=r"aten.special_airy_ai.default.*TURBINE_FALLBACK=device"):
            torch.special.airy_ai(torch.rand(3, device=D))


def test_policy_from_environment_and_validation(monkeypatch):
    monkeypatch.setenv("TURBINE_FALLBACK", "host")
    assert Config.from_env().fallback == "host"
    with pytest.raises(ValueError, match="unknown turbine fallback policy"):
        with turbine.fallback("cpu"):
            pass


def test_each_fallback_is_counted_and_warned_once_per_op(stats):
    fresh_warnings()
    xd = torch.rand(5, device=D)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            # Read each result: with background compiles, an op whose compile fails runs its
            # fallback (and warns) when the result is first needed.
            torch.special.airy_ai(xd).cpu()
    relevant = [w for w in caught if issubclass(w.category, turbine.TurbineFallbackWarning)]
    assert len(relevant) == 1 and "aten.special_airy_ai.default" in str(relevant[0].message)
    assert stats()["fallbacks"]["aten.special_airy_ai.default"] == 3


@pytest.mark.parametrize("policy", POLICIES)
def test_data_dependent_output_shapes(policy):
    x = torch.randn(6, 5)
    xd = x.to(D)
    with turbine.fallback(policy):
        torch.testing.assert_close(torch.nonzero(xd > 0).cpu(), torch.nonzero(x > 0))
        torch.testing.assert_close(torch.unique(xd.round()).cpu(), torch.unique(x.round()))
        torch.testing.assert_close(torch.masked_select(xd, xd > 0.5).cpu(), torch.masked_select(x, x > 0.5))
        torch.testing.assert_close(xd[xd < 0].cpu(), x[x < 0])
        assigned, expected = xd.clone(), x.clone()
        assigned[assigned > 0] = -1.0
        expected[expected > 0] = -1.0
        torch.testing.assert_close(assigned.cpu(), expected)
        assert torch.equal(xd, xd.clone()) and not torch.equal(xd, xd + 1)


@pytest.mark.parametrize("policy", POLICIES)
def test_in_place_and_out_fallbacks_change_the_tensor_and_its_views(policy):
    x, y = torch.rand(4, 5) + 0.1, torch.rand(4, 5) * 2  # igamma_: no lowering, no decomposition
    with turbine.fallback(policy):
        xd = x.to(D)
        row = xd[1]
        xd[1:3].igamma_(y[1:3].to(D))
        expected = x.clone()
        expected[1:3].igamma_(y[1:3])
        torch.testing.assert_close(xd.cpu(), expected)
        torch.testing.assert_close(row.cpu(), expected[1])
        out = torch.empty(4, 5).to(D)
        result = torch.special.airy_ai(x.to(D), out=out)
        assert result is out
        torch.testing.assert_close(out.cpu(), torch.special.airy_ai(x))


def test_op_neither_path_can_run_names_both_attempts():
    xd = torch.rand(3, 3, device=D).half()  # torch's CPU kernel has no float16 airy_ai, nor IREE a lowering
    with pytest.raises(turbine.UnsupportedOpError, match=r"IREE could not run it .* neither could torch's kernel .* not implemented for 'Half'"):
        torch.special.airy_ai(xd).cpu()


def test_failed_compile_costs_one_compile_and_none_in_a_second_process(tmp_path):
    script = textwrap.dedent(
        """
        import json, warnings, torch, turbine
        warnings.simplefilter("ignore")
        x = torch.rand(8, device="turbine:cpu") - 0.5
        for _ in range(3):
            y = torch.special.airy_ai(x)
        assert torch.allclose(y.cpu(), torch.special.airy_ai(x.cpu()))
        print(json.dumps(turbine.stats()))
        """
    )
    env = dict(os.environ, TURBINE_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300) for _ in range(2)]
    first, second = [json.loads(r.stdout.strip().splitlines()[-1]) for r in runs]
    assert first["compile_failures"] == 1 and first["fallbacks"]["aten.special_airy_ai.default"] == 3
    assert second["compile_failures"] == 0 and second["kernels_compiled"] == 0
    assert second["fallbacks"]["aten.special_airy_ai.default"] == 3


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
@pytest.mark.parametrize("policy", POLICIES)
def test_ops_whose_meta_rule_reads_values_go_to_the_fallback(policy):
    """allclose's meta rule calls .item(), which meta tensors cannot; torch's CPU kernel can."""
    a = torch.randn(5)
    with turbine.fallback(policy):
        assert torch.allclose(a.to(D), a.to(D)) and not torch.allclose(a.to(D), (a + 1).to(D))
