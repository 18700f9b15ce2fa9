"""GPU checks; they run where IREE's cuda driver sees a device (the H200 device machine) and skip elsewhere."""

import copy
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import turbine

GPU = "turbine:cuda0"
pytestmark = pytest.mark.skipif(GPU not in turbine.devices(), reason="no CUDA device visible to IREE here")


def test_demo_on_gpu():
    x, w = torch.randn(64, 128), torch.randn(128, 32)
    y = torch.relu(x.to(GPU) @ w.to(GPU) + 1.0)
    v, i = torch.max(y, dim=1)
    expected = torch.relu(x @ w + 1.0).max(dim=1)
    torch.testing.assert_close(v.cpu(), expected.values, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(i.cpu(), expected.indices)


def test_views_and_in_place_on_gpu():
    x = torch.randn(6, 5)
    xd = x.to(GPU)
    xd[0].add_(1)
    xd.t()[1:3].mul_(2)
    expected = x.clone()
    expected[0].add_(1)
    expected.t()[1:3].mul_(2)
    torch.testing.assert_close(xd.cpu(), expected)


def test_backward_on_gpu():
    x = torch.randn(5, 4, requires_grad=True)
    xd = x.detach().to(GPU).requires_grad_()
    (xd.tanh() * xd).sum().backward()
    (x.tanh() * x).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, atol=1e-5, rtol=1e-5)


def test_mixed_gpu_and_cpu_devices_fail_like_torch():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, device=GPU) + torch.ones(2, device="turbine:cpu")


needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")


@needs_torch_cuda
@pytest.mark.parametrize("threads", [False, True], ids=["single-threaded", "multi-threaded"])
def test_torch_cuda_autograd_works_after_import_turbine(threads):
    """Naming PrivateUse1 broke every torch CUDA backward (pytorch#161129); turbine's
    accelerator_fix keeps it working, autograd's device threads on or off."""
    with torch.autograd.set_multithreading_enabled(threads):
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        reference = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        reference.load_state_dict(model.state_dict())
        model.cuda()
        x = torch.randn(32, 64)
        xc = x.cuda().requires_grad_()
        x.requires_grad_()
        model(xc).logsumexp(1).sum().backward()
        reference(x).logsumexp(1).sum().backward()
    torch.testing.assert_close(xc.grad.cpu(), x.grad, atol=1e-4, rtol=1e-4)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-4)


@needs_torch_cuda
def test_torch_cuda_backward_from_several_threads_and_a_side_stream():
    errors = []

    def work():
        try:
            for _ in range(20):
                x = torch.randn(16, 64, device="cuda", requires_grad=True)
                (x.tanh() * x).sum().backward()
                t = x.detach().tanh()
                torch.testing.assert_close(x.grad, (1 - t**2) * x.detach() + t)
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]

    before = torch.cuda.memory_allocated()
    side = torch.cuda.Stream()
    x = torch.randn(256, 256, device="cuda", requires_grad=True)
    with torch.cuda.stream(side):
        y = (x @ x).relu().sum()
    torch.cuda.current_stream().wait_stream(side)
    y.backward()
    torch.cuda.synchronize()
    xc = x.detach().cpu().requires_grad_()
    (xc @ xc).relu().sum().backward()
    torch.testing.assert_close(x.grad.cpu(), xc.grad, atol=1e-2, rtol=1e-3)
    assert torch.cuda.memory_allocated() > before  # torch's allocator still counts


@needs_torch_cuda
@pytest.mark.parametrize("threads", [False, True], ids=["single-threaded", "multi-threaded"])
def test_a_model_half_on_torch_cuda_half_on_turbine_trains_like_the_cpu(threads):
    torch.manual_seed(1)
    first, second = torch.nn.Linear(32, 64), torch.nn.Linear(64, 10)
    first_gpu, second_gpu = torch.nn.Linear(32, 64), torch.nn.Linear(64, 10)
    first_gpu.load_state_dict(first.state_dict())
    second_gpu.load_state_dict(second.state_dict())
    first_gpu.cuda()
    second_gpu.to(GPU)
    optimizer = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    optimizer_gpu = torch.optim.SGD([*first_gpu.parameters(), *second_gpu.parameters()], lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    with torch.autograd.set_multithreading_enabled(threads):
        for _ in range(5):
            optimizer.zero_grad()
            optimizer_gpu.zero_grad()
            loss = torch.nn.functional.cross_entropy(second(first(x).relu()), y)
            hidden = first_gpu(x.cuda()).relu().to(GPU)
            loss_gpu = torch.nn.functional.cross_entropy(second_gpu(hidden), y.to(GPU))
            loss.backward()
            loss_gpu.backward()
            optimizer.step()
            optimizer_gpu.step()
            torch.testing.assert_close(loss_gpu.cpu(), loss.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first_gpu.weight.detach().cpu(), first.weight.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(second_gpu.weight.detach().cpu(), second.weight.detach(), atol=1e-4, rtol=1e-4)


def test_out_of_memory_names_the_op_and_the_gpu_runs_on():
    with pytest.raises(torch.OutOfMemoryError, match="turbine:cuda0 is out of memory"):
        torch.ones(1 << 40, device=GPU).cpu()  # 4 TiB
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    torch.testing.assert_close((a.to(GPU) @ b.to(GPU) + 1).relu().cpu(), (a @ b + 1).relu(), atol=1e-3, rtol=1e-3)


def test_a_kernel_that_faults_says_the_gpu_is_lost():
    """An index far out of bounds makes IREE's gather read an illegal address, which ends the CUDA
    context: the read that meets it and every later use say so at once, and the process exits
    with status 1 instead of hanging in the lost context's teardown (in a new process)."""
    script = textwrap.dedent(f"""
        import torch, turbine
        from turbine.errors import DeviceLostError
        x = torch.arange(10., device={GPU!r})
        try:
            # an unchecked read far outside the tensor (gather's index is checked, _unsafe_index's not)
            torch.ops.aten._unsafe_index.Tensor(x, [torch.tensor([1 << 30], device={GPU!r})]).cpu()
            raise AssertionError("the fault went unnoticed")
        except DeviceLostError as error:
            assert "is lost: a kernel faulted" in str(error), error
        for later in (lambda: (x + 1).cpu(), lambda: torch.ones(3, device={GPU!r}).cpu()):
            try:
                later()
                raise AssertionError("a lost device ran an op")
            except DeviceLostError as error:
                assert "restart the process" in str(error)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    assert done.returncode == 1 and "turbine:cuda0 was lost; exiting without releasing it" in done.stderr


@pytest.fixture
def vendor_wins(monkeypatch):
    """The vendor executor on (the suite runs IREE alone), and every timing won by it."""
    from turbine.config import override
    from turbine.eager import timed_plan

    calls = []

    def best(run):
        calls.append(run)
        return (2.0 if len(calls) % 2 else 1.0), run()

    monkeypatch.setattr(timed_plan, "_best", best)
    with override(executors="auto"):
        yield


def test_vendor_and_iree_kernels_take_turns_without_host_waits(vendor_wins, stats):
    """IREE's kernel, torch's cuBLAS on its result, IREE's again, cuBLAS again: each reads what the
    other wrote, in order (torch's stream is waited for only where IREE reads torch's memory)."""
    x, w1, w2 = torch.randn(64, 128), torch.randn(128, 96), torch.randn(96, 32)
    y = torch.relu((x.to(GPU) * 2) @ w1.to(GPU)) @ w2.to(GPU) + 1
    torch.testing.assert_close(y.cpu(), torch.relu((x * 2) @ w1) @ w2 + 1, atol=1e-3, rtol=1e-3)
    assert stats()["executors"].get("vendor", 0) >= 1


def test_a_vendor_result_read_on_another_torch_stream(vendor_wins):
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    ad, bd = a.to(GPU), b.to(GPU)
    (ad @ bd).cpu()  # times and chooses
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        product = ad @ bd
    torch.testing.assert_close((product @ bd).cpu(), (a @ b) @ b, atol=1e-2, rtol=1e-3)


def test_memory_torch_still_reads_goes_back_to_iree_only_when_torch_is_done(vendor_wins):
    """A torch kernel queued behind a long one reads an IREE buffer whose tensor is dropped at
    once: the memory is kept (device/retired.py) while IREE allocates and fills new buffers of the
    same size, and torch's result is still the data it was given."""
    from turbine.config import override

    with override(background_compile=False):  # compiled and timed now: the vendor runs the next call
        (torch.randn(1024, 1024).to(GPU) * 2).cpu()  # (the timing's runs keep their inputs alive)
    x = torch.randn(1024, 1024)
    xd = x.to(GPU)  # IREE's memory
    device = xd._storage.device
    torch.cuda._sleep(2_000_000_000)  # about a second of torch's stream before its read of xd
    y = xd * 2
    del xd  # the last reference: the buffer dies here (a gc.collect() took longer than a short sleep)
    assert len(device.retired) >= 1, "the memory went back to IREE while torch's read was queued"
    fills = [torch.full((1024, 1024), 7.0).to(GPU) for _ in range(8)]  # IREE's new buffers
    torch.testing.assert_close(y.cpu(), x * 2)
    assert all(float(f[0, 0].cpu()) == 7.0 for f in fills)
    turbine.synchronize(GPU)
    assert len(device.retired) == 0, "kept memory outlived a synchronize"


def test_timing_chooses_between_cublas_and_iree_for_a_real_matmul(fresh_cache, stats):
    """On an empty cache (no earlier test's plan or kept choice): one mm plan, timed on both."""
    from turbine.config import override
    from turbine.eager.dispatch import plans
    from turbine.eager.timed_plan import TimedPlan

    a, b = torch.randn(512, 512, dtype=torch.bfloat16), torch.randn(512, 512, dtype=torch.bfloat16)
    with override(executors="auto", background_compile=False):
        result = (a.to(GPU) @ b.to(GPU)).cpu()
        (plan,) = [p for p in plans().values() if isinstance(p, TimedPlan) and p.func is torch.ops.aten.mm.default]
    torch.testing.assert_close(result.float(), (a.float() @ b.float()), atol=0.5, rtol=2e-2)
    assert plan.chosen in ("iree", "vendor") and set(plan.times) == {"iree", "vendor"}


def test_attention_trains_on_torchs_fused_kernels(vendor_wins, fresh_cache, stats):
    """(fresh_cache: no plan of an earlier test's softmax is left to be found.)"""
    from turbine.eager.dispatch import plans

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True, dropout=0.0)
    ours = copy.deepcopy(layer).to(GPU)
    x = torch.randn(2, 16, 64)
    for module, inp in ((layer, x), (ours, x.to(GPU))):
        module(inp).square().mean().backward()
    for p, q in zip(layer.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-4, rtol=1e-3)
    assert stats()["executors"].get("vendor", 0) >= 2  # attention forward and backward at least
    assert not [key for key in plans() if "softmax" in str(key[0])]  # not torch's math of attention


def test_a_thread_that_did_not_open_the_gpu_compiles_and_loads_kernels():
    """IREE makes the CUDA context current only on the thread that opened the device; kernels
    first loaded on another thread (autograd's, a user's) must work too."""
    x = torch.randn(7, 3)
    xd = x.to(GPU)
    found = {}

    def work():
        try:
            found["result"] = (torch.special.expit(xd * 1.25) - 0.5).cpu()  # ops no test ran before
        except BaseException as error:  # reported in the main thread
            found["error"] = error

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=300)
    assert "error" not in found, found.get("error")
    torch.testing.assert_close(found["result"], torch.special.expit(x * 1.25) - 0.5)
