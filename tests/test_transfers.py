"""Buffers stay on the device: host transfers happen only when the user reads."""


import numpy as np
import pytest
import torch

import turbine
from checks import D
from turbine.device import upload



def test_chain_of_100_ops_makes_no_host_transfer(stats):
    x = torch.randn(32, 32)
    w = torch.randn(32, 32) * 0.1
    xd, wd = x.to(D), w.to(D)

    def chain(y: torch.Tensor) -> torch.Tensor:
        for i in range(25):
            y = torch.tanh(y @ wd) * 1.5 + 0.1
            y = y - y.mean(dim=1, keepdim=True)
        return y

    chain(xd).cpu()  # compiles the kernels (their launches wait for them until this read)
    turbine.reset_stats()
    y, expected = chain(xd), x
    for i in range(25):
        expected = torch.tanh(expected @ w) * 1.5 + 0.1
        expected = expected - expected.mean(dim=1, keepdim=True)
    after_upload = 0
    on_device = stats()["dispatches"] + stats()["executors"].get("vendor", 0)  # IREE's kernels or torch's on the GPU
    assert on_device >= 100
    assert stats()["host_transfers"] == after_upload
    result = y.cpu()
    assert stats()["host_transfers"] == after_upload + 1
    assert stats()["host_transfer_bytes"] >= 32 * 32 * 4
    torch.testing.assert_close(result, expected, atol=1e-4, rtol=1e-4)


def test_factories_without_host_data_transfer_nothing(stats):
    torch.zeros(100, 100, device=D)
    torch.ones(10, device=D) + torch.arange(10, device=D)
    torch.full((4, 4), 2.0, device=D).sum()
    assert stats()["host_transfers"] == 0


def test_reads_count_transfers(stats):
    x = torch.randn(8, device=D)
    uploads = stats()["host_transfers"]
    x.tolist()
    x[2].item()
    assert stats()["host_transfers"] == uploads + 2


def test_stats_reset():
    torch.ones(3, device=D).cpu()
    turbine.reset_stats()
    data = turbine.stats()
    for name in ["kernels_compiled", "cache_hits_memory", "cache_hits_disk", "dispatches", "host_transfers",
                 "host_transfer_bytes"]:
        assert data[name] == 0
    assert data["fallbacks"] == {}


def test_a_broadcast_single_element_uploads():
    """A 1-element tensor with stride 0 counts as contiguous in torch; its bytes still upload."""
    x = torch.tensor(3.0).expand(1)
    assert x.stride() == (0,)
    torch.testing.assert_close(x.to(D).cpu(), torch.tensor([3.0]))


def test_a_download_mapped_with_stride_0_reads_as_a_whole_tensor(monkeypatch):
    """IREE can map a buffer filled with one repeated byte as a stride-0 array (found by the
    OpInfo run); reading it must still give a tensor of its own, with the shape and values."""
    import numpy as np

    from turbine.eager import transfer

    x = torch.full((3, 4), 2.5).to(D)
    real = transfer.download

    def as_stride_0(buffer, nbytes):
        first = real(buffer, nbytes)[:1].copy()
        return np.lib.stride_tricks.as_strided(first, (nbytes,), (0,))  # every byte is the first one

    monkeypatch.setattr(transfer, "download", as_stride_0)
    value = int(torch.randint(-100, 100, ()))  # one repeated byte: a random int8
    filled = torch.full((3, 4), value, dtype=torch.int8)
    read = filled.to(D).cpu()
    assert read.shape == (3, 4) and read.is_contiguous()
    torch.testing.assert_close(read, filled)
    read += 1  # the host copy is writable and independent of the mapping
    torch.testing.assert_close(read, filled + 1)
    monkeypatch.undo()
    torch.testing.assert_close(x.cpu(), torch.full((3, 4), 2.5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.bool, torch.complex64])
def test_empty_tensors_of_every_dtype_upload(dtype):
    """An empty bfloat16 tensor failed to upload (numpy has no bfloat16; non-empty ones went as
    bytes): ``torch.tensor([], dtype=torch.bfloat16, device=...)`` starts every transformers KV
    cache, so no bfloat16 model could generate."""
    empty = torch.tensor([], dtype=dtype, device=D)
    assert empty.dtype == dtype and empty.cpu().shape == (0,)
    grown = torch.cat([empty, torch.ones(3, dtype=dtype, device=D)])
    torch.testing.assert_close(grown.cpu(), torch.ones(3, dtype=dtype))
    assert torch.empty(2, 0, 3, dtype=dtype).to(D).cpu().shape == (2, 0, 3)


def test_a_read_through_staging_memory_takes_a_buffer_larger_than_the_bytes_read():
    """A GPU's memory is read through a host-visible staging buffer, filled by IREE's queue_copy,
    which copies the whole source: a staging buffer of only the bytes wanted (a storage that
    resize_ grew in place holds more) was refused ("Source and buffer length must be less than
    the target buffer length"). The CPU's memory needs no staging, so the copy is asked for here."""
    device = torch.empty(0, device=D).turbine_device
    values = np.arange(5, dtype=np.float32)
    source = upload(device, values)
    staging = device.staging_copy(source.hal, 16)
    mapped = staging.map().asarray((staging.byte_length(),), np.dtype(np.uint8))
    assert np.array_equal(mapped[:16].view(np.float32), values[:4])
