"""Kernels compile in separate compiler processes: a compiler crash fails one compile, not the session."""

import logging
import threading

import pytest
import torch

import turbine
from turbine.config import override
from turbine.eager import lowering
from turbine.kernels_cache import Target, compile_mlir, tracing

aten = torch.ops.aten
CPU = Target("llvm-cpu", "host", ())


def test_a_compiler_crash_is_a_compile_error_and_the_next_compile_works():
    # IREE 3.13's torch-mlir view lowering divides by zero on this view of an empty tensor.
    crashing = lowering.lower(lambda x: [aten.view.default(x, [5, 0])], [((0, 5), torch.float32)])
    with pytest.raises(turbine.CompileError, match="compiler crashed.*SIGFPE"):
        compile_mlir(crashing, CPU)
    good = lowering.lower(lambda x: [x * 2], [((3,), torch.float32)])
    assert len(compile_mlir(good, CPU)) > 0


def test_compile_errors_quote_the_compiler():
    failing = lowering.lower(
        lambda x, i, s: [aten.scatter.src(x, 0, i, s)], [((), torch.float32), ((), torch.int64), ((), torch.float32)]
    )
    with pytest.raises(turbine.CompileError, match="error: 'iree_linalg_ext.scatter' op"):
        compile_mlir(failing, CPU)


def test_threads_compile_at_the_same_time_and_each_gets_its_own_kernel():
    texts = [lowering.lower(lambda x: [x + 1], [((k + 1,), torch.float32)]) for k in range(4)]
    results: dict[int, bytes] = {}
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, compile_mlir(texts[k], CPU))) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [0, 1, 2, 3]
    assert len(set(results.values())) == 4  # different shapes: different modules


def test_a_compile_error_names_every_lowering_that_failed():
    """The op as it is failed, and so did the second try (here: torch has no decomposition)."""
    with turbine.fallback("error"), pytest.raises(turbine.UnsupportedOpError) as error:
        torch.special.airy_ai(torch.rand(3, device="turbine:cpu"))
    message = str(error.value.__cause__)
    assert "aten.special_airy_ai.default" in message and "alternative 2: torch has no decomposition" in message


def test_a_lowering_whose_text_already_failed_is_not_compiled_again(monkeypatch):
    """The last alternatives of an op (without the corrections of the ops inside it) trace the
    same text as the first where nothing inside was corrected: that text is compiled once."""
    from turbine.kernels_cache import cache

    compiled = []

    def compile(text: str, target: Target) -> bytes:
        compiled.append(text)
        if text == "same":
            raise turbine.CompileError("refused")
        return b"module"

    monkeypatch.setattr(cache, "compile_mlir", compile)
    assert cache._compile_first([lambda: "same", lambda: "same", lambda: "other"], CPU) == (b"module", "other", 2)
    assert compiled == ["same", "other"]
    with pytest.raises(turbine.CompileError, match="refused"):
        cache._compile_first([lambda: "same", lambda: "same"], CPU)


def test_a_trace_torch_refuses_logs_nothing_of_torchs():
    """A lowering whose trace torch's shape rule refuses (``_grouped_mm`` traced in float32) is a
    failed lowering turbine reports itself; torch's fake tensors also logged it at ERROR with a
    traceback, which read as a crash. Outside turbine's traces torch's log is left alone."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    logger.addHandler(handler)
    try:
        with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
            tracing.trace(lambda a, b: torch._grouped_mm(a, b), [((16, 16), torch.float32), ((2, 16, 16), torch.float32)])
        assert not records, [r.getMessage() for r in records]
        logger.error("torch's own")
        assert [r.getMessage() for r in records] == ["torch's own"]
    finally:
        logger.removeHandler(handler)


def test_a_compile_past_the_time_limit_is_stopped_and_the_next_compile_works():
    """IREE 3.13 never finished some compiles (a 3-D grid sampler's gradient for a single-point
    grid); past ``TURBINE_COMPILE_TIMEOUT`` the compiler process is stopped and replaced."""
    good = lowering.lower(lambda x: [x * 2], [((3,), torch.float32)])
    with override(compile_timeout=0.001), pytest.raises(turbine.CompileTimeout, match=r"more than 0.001 s.*TURBINE_COMPILE_TIMEOUT"):
        compile_mlir(good, CPU)
    assert len(compile_mlir(good, CPU)) > 0


@pytest.mark.filterwarnings("ignore::turbine.TurbineFallbackWarning")
def test_an_op_whose_compile_timed_out_falls_back_and_its_failure_stays_off_the_disk(fresh_cache, stats):
    """The op runs by the fallback policy; the disk cache keeps no failure (a busy machine may
    have slowed the compile), and a new session compiles it again."""
    x = torch.randn(7, 3)
    with override(compile_timeout=0.001, background_compile=False):
        result = torch.exp(x.to("turbine:cpu"))
    torch.testing.assert_close(result.cpu(), torch.exp(x))
    assert stats()["compile_failures"] >= 1 and stats()["fallbacks"]
    assert not fresh_cache.failures()


def test_a_background_compile_whose_first_lowering_fails_to_trace_tries_the_next():
    """The first lowering is traced by the thread that starts the compile (kernels_cache's
    ``start``); its failure still goes to the compile thread, which tries the next one, and
    reports it with the others' when none compiles."""
    from turbine.kernels_cache import kernel_cache

    device = torch.empty(0, device="turbine:cpu").turbine_device

    def broken() -> str:
        raise RuntimeError("no trace")

    def good() -> str:
        return lowering.lower(lambda x: [x * 3], [((7, 3), torch.float32)])

    assert kernel_cache.start(("test: first lowering fails", 7, 3), device, [broken, good], "x * 3").result()
    failing = kernel_cache.start(("test: no lowering traces",), device, [broken], "nothing")
    with pytest.raises(turbine.CompileError, match="turbine could not lower it: RuntimeError: no trace"):
        failing.result()


def test_a_compiler_crash_fails_the_op_for_the_session_only(fresh_cache):
    """A crash is not kept on disk with the failures later processes skip: one seen once (a
    SIGSEGV on a uint8 sum) did not recur, yet every later process had sent that op to the
    fallback."""
    from turbine.kernels_cache import kernel_cache

    crashing = lowering.lower(lambda x: [aten.view.default(x, [5, 0])], [((0, 5), torch.float32)])
    device = torch.empty(0, device="turbine:cpu").turbine_device
    with pytest.raises(turbine.CompilerCrash, match="crashed"):
        kernel_cache.kernel(("test: a compiler crash",), device, lambda: crashing, "a crashing view")
    assert not fresh_cache.failures()
