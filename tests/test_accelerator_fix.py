"""torch's own CUDA autograd beside turbine (turbine/eager/accelerator_fix.py).

These run anywhere: the slot is found in libtorch_cpu of every torch build, the replacement is
called directly, and a subprocess patches a CPU torch's engine and trains on both sides. The CUDA
cases (torch CUDA backward after ``import turbine``, a model mixing both) are in test_gpu.py.
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from checks import D
from turbine.eager import accelerator_fix

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"),
    reason="the fix patches ELF libraries on Linux x86-64 and aarch64",
)

LIBRARY = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
PRIVATE_USE_1 = int(torch._C._autograd.DeviceType.PrivateUse1)


def test_the_replacement_answers_only_for_turbine():
    replacement = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_int8)(
        accelerator_fix._executable(accelerator_fix._replacement_code(PRIVATE_USE_1))
    )
    assert replacement(PRIVATE_USE_1)
    cuda, cpu = int(torch._C._autograd.DeviceType.CUDA), int(torch._C._autograd.DeviceType.CPU)
    assert not replacement(cuda) and not replacement(cpu)


def _executable_mapping(address: int) -> bool:
    """Whether ``address`` lies in a mapping of this process that may be executed."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, permissions = line.split()[:2]
            start, end = (int(bound, 16) for bound in span.split("-"))
            if start <= address < end:
                return "x" in permissions
    return False


def test_a_new_replacement_leaves_earlier_ones_in_place():
    """A patched slot calls the first page made; a later one must not unmap it (this segfaulted
    the next CUDA backward once the test above had run in a process where the fix was applied)."""
    first = accelerator_fix._executable(accelerator_fix._replacement_code(PRIVATE_USE_1))
    accelerator_fix._executable(accelerator_fix._replacement_code(PRIVATE_USE_1))
    assert _executable_mapping(first)
    assert ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_int8)(first)(PRIVATE_USE_1)


def test_the_slot_is_where_libtorch_cpu_calls_is_accelerator():
    """After a backward (the engine calls isAccelerator), the slot holds isAccelerator's address."""
    if accelerator_fix.status() == "applied":
        pytest.skip("this process's slot is already patched")
    x = torch.randn(3, requires_grad=True)
    (x.to(D) * 2).sum().backward()
    slot = accelerator_fix._load_address(LIBRARY) + accelerator_fix._got_slot(LIBRARY)
    target = ctypes.cast(ctypes.CDLL(LIBRARY)[accelerator_fix.SYMBOL.decode()], ctypes.c_void_p).value
    assert ctypes.c_uint64.from_address(slot).value == target


def test_status_says_why_nothing_was_done():
    status = accelerator_fix.status()
    if torch.backends.cuda.is_built():
        assert status == "applied"
    else:
        assert status == "this torch has no CUDA"


@pytest.mark.slow
def test_a_patched_engine_still_runs_cpu_and_turbine_backward():
    """Force the patch on this (possibly CPU-only) torch: gradients on the CPU and on turbine,
    multi-threaded autograd on and off, stay torch's."""
    script = textwrap.dedent(f"""
        import torch, turbine
        from turbine.eager import accelerator_fix
        assert accelerator_fix._point_slot({PRIVATE_USE_1}) == "applied"
        for threads in (False, True):
            with torch.autograd.set_multithreading_enabled(threads):
                x = torch.randn(6, 5, requires_grad=True)
                xd = x.detach().to({D!r}).requires_grad_()
                (x.tanh() * x).sum().backward()
                (xd.tanh() * xd).sum().backward()
                expected = (1 - x.detach().tanh() ** 2) * x.detach() + x.detach().tanh()
                torch.testing.assert_close(x.grad, expected)
                torch.testing.assert_close(xd.grad.cpu(), expected, rtol=1e-5, atol=1e-6)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
