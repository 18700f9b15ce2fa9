"""A process that used turbine ends with Python's own exit status, whatever went wrong on the way
(issue 20, item 3): each case runs in a fresh interpreter, and its status is checked.

Statuses: 0 for a script that ends normally (errors caught), 1 for one that ends with an
uncaught exception, and -SIGINT for an uncaught KeyboardInterrupt (Python ends itself with the
signal). A crash at exit (status 139, SIGSEGV) fails every case.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from checks import D

PRELUDE = f"""
import gc, signal, warnings
import torch, turbine
warnings.simplefilter("ignore")
D = {D!r}
# Ctrl-C as in a terminal: a process started in the background (CI's, the GPU machine's) inherits
# SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
signal.signal(signal.SIGINT, signal.default_int_handler)
"""

#: name -> (script, expected status, text its stderr must hold)
CASES = {
    "an error an op raised, caught": (
        """
        try:
            torch.ones(3, device=D).to_sparse()
        except Exception as error:
            print(type(error).__name__)
        assert (torch.ones(3, device=D) * 2).sum().item() == 6
        """,
        0,
        "",
    ),
    "an error an op raised, not caught": ("torch.ones(3, device=D).to_sparse()", 1, "to_sparse"),
    "a fallback's shared buffer in a reference cycle at exit": (
        """
        x = torch.rand(5, device=D).sort().values
        y = torch.searchsorted(x, x)  # torch's kernel over the device memory: a DLPack view
        cycle = [x, y]
        cycle.append(cycle)
        del x, y
        """,
        0,
        "",
    ),
    "an op IREE cannot compile, with the fallback off": (
        """
        with turbine.fallback("error"):
            torch.special.gammainc(torch.rand(4, device=D) + 1, torch.rand(4, device=D) + 1).cpu()
        """,
        1,
        "fallback policy is 'error'",
    ),
    "an error inside backward": (
        """
        class Fails(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                raise ValueError("backward failed on purpose")

        x = torch.ones(4, device=D, requires_grad=True)
        try:
            Fails.apply(x * 3).sum().backward()
        except ValueError as error:
            print(error)
        (x * 3).sum().backward()
        assert x.grad.cpu().tolist() == [3.0] * 4
        Fails.apply(x).sum().backward()
        """,
        1,
        "backward failed on purpose",
    ),
    "Ctrl-C in the middle of ops, caught, then more ops": (
        """
        def interrupt(*_):
            raise KeyboardInterrupt
        signal.signal(signal.SIGALRM, interrupt)
        x = torch.ones(64, device=D)
        y = ((x + x) - x).cpu()  # the kernels compiled: the interrupt lands among running ops
        y = x
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            for _ in range(200_000):
                y = (y + x) - x
            raise AssertionError("the interrupt never arrived")
        except KeyboardInterrupt:
            print("interrupted")
        assert (y - x).abs().sum().item() == 0 and (x + 1).sum().item() == 128
        """,
        0,
        "",
    ),
    "Ctrl-C in the middle of ops, not caught": (
        """
        signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
        x = torch.ones(64, device=D)
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # the first kernels are still compiling
        for _ in range(200_000):
            x = (x + 1) - 1
        raise AssertionError("the interrupt never arrived")
        """,
        -signal.SIGINT,
        "KeyboardInterrupt",
    ),
    "Ctrl-C not caught, with an exit hook that runs Python source": (
        # torch._dynamo's exit hook imports tabulate where it is installed, whose namedtuples are
        # made by eval: that cleared CPython's note of the interrupt, and the status was 1
        """
        import atexit
        atexit.register(lambda: eval("1"))
        x = torch.ones(64, device=D)
        (x + 1).cpu()
        raise KeyboardInterrupt
        """,
        -signal.SIGINT,
        "KeyboardInterrupt",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_process_ends_with_pythons_status(case):
    script, status, words = CASES[case]
    source = PRELUDE + "import os\n" + textwrap.dedent(script)
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=240, env=os.environ)
    assert done.returncode == status, f"status {done.returncode}, stderr:\n{done.stderr[-3000:]}"
    assert words in done.stderr


def test_a_ctrl_c_dropped_in_turbines_finalizer_is_raised_again(monkeypatch):
    """Python drops an exception raised in a finalizer; a KeyboardInterrupt dropped in turbine's
    (where a Ctrl-C in a loop of ops lands now and then) is raised again at the next bytecode."""
    from types import SimpleNamespace

    from turbine import interrupts
    from turbine.device.buffer import Buffer

    passed_on = []
    monkeypatch.setattr(sys, "unraisablehook", passed_on.append)  # (pytest sets its own for each test)
    monkeypatch.setattr(interrupts, "_previous", None)
    interrupts.install()
    assert sys.unraisablehook is interrupts._hook and interrupts._previous == passed_on.append
    dropped = SimpleNamespace(exc_type=KeyboardInterrupt, exc_value=KeyboardInterrupt(), exc_traceback=None, err_msg=None, object=Buffer.__del__)
    previous_handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # CI may start with it ignored
    try:
        start = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            sys.unraisablehook(dropped)
            time.sleep(5)  # the interrupt arrives in the sleep, a moment after the hook returned
        assert time.perf_counter() - start < 2.5, "the interrupt did not wake a waiting main thread"
    finally:
        signal.signal(signal.SIGINT, previous_handler)
    assert passed_on == []
    elsewhere = SimpleNamespace(**(vars(dropped) | {"object": len}))
    sys.unraisablehook(elsewhere)
    other_error = SimpleNamespace(**(vars(dropped) | {"exc_type": ValueError}))
    sys.unraisablehook(other_error)
    assert passed_on == [elsewhere, other_error]
