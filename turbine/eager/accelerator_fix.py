"""Keeping torch's own CUDA autograd working beside the turbine backend (pytorch/pytorch#161129).

Naming PrivateUse1 "turbine" makes it torch's one *accelerator* (``at::getAccelerator()`` answers
PrivateUse1 first whenever it is named: seen on torch 2.11, and 2.13 has the same code). Autograd's engine then looks
for each backward node's stream among its inputs of the accelerator's type; a node over CUDA
tensors has none, and every CUDA backward fails with ``opt_ready_stream && opt_parent_stream
INTERNAL ASSERT FAILED`` (engine.cpp), in the whole process, whether or not turbine is used.

The engine asks ``at::accelerator::isAccelerator(device_type)`` whether a gradient needs that stream
bookkeeping. This module makes the engine's answer "only the current accelerator" (turbine), so it
handles CUDA gradients as it handles CPU ones: without stream guards, on the thread's current
stream, which is what a single-stream CUDA program does anyway. It does so by pointing the slot
through which libtorch_cpu calls ``isAccelerator`` (its PLT entry in the global offset table) at a
four-instruction function. torch's other libraries, and its Python ``torch.accelerator`` API, keep
their own answers. libtorch_cpu's other callers (torch 2.13) see the new answer too:
``_to_copy`` then copies a CUDA tensor to the CPU with ``non_blocking=True`` into ordinary memory
instead of pinned memory (the copy waits for its data; torch's pinned allocator is turbine's once
PrivateUse1 is named, which has none), the deprecated ``is_pinned(device="cuda")`` raises, and
quantized tensors are made as for a CPU device.

Where this cannot be done (not Linux on x86-64 or aarch64, a torch build without that slot, no
CUDA in torch), it does nothing and says why (:func:`status`); ``TURBINE_FIX_CUDA_AUTOGRAD=0``
turns it off. What users lose: a CUDA program that runs its forward on its own streams gets no
stream synchronisation from the engine in backward (torch's default stream is unaffected).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import platform
import struct

import numpy as np
import torch

from turbine.config import config

log = logging.getLogger("turbine")

#: torch's mangled name of ``bool at::accelerator::isAccelerator(c10::DeviceType)``.
SYMBOL = b"_ZN2at11accelerator13isAcceleratorEN3c1010DeviceTypeE"

#: Why the fix is or is not in place ("applied", or the reason it is not).
_status = "not tried"
#: The executable pages made so far: a slot may point into any of them, so none is ever unmapped.
_code_pages: list[mmap.mmap] = []


def status() -> str:
    """"applied", or why torch's CUDA autograd is left as torch has it."""
    return _status


def _replacement_code(device_type: int) -> bytes:
    """Machine code for ``bool f(int8 t) { return t == device_type; }`` on this processor."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        # xor eax, eax; cmp dil, imm8; sete al; ret
        return bytes([0x31, 0xC0, 0x40, 0x80, 0xFF, device_type, 0x0F, 0x94, 0xC0, 0xC3])
    if machine in ("aarch64", "arm64"):
        # and w0, w0, #0xff; cmp w0, #imm12; cset w0, eq; ret
        cmp = 0x7100001F | (device_type << 10)
        return struct.pack("<4I", 0x12001C00, cmp, 0x1A9F17E0, 0xD65F03C0)
    raise OSError(f"no replacement for processor {machine!r}")


def _got_slot(library: str) -> int:
    """The offset (from the library's load address) of its PLT slot for :data:`SYMBOL`."""
    with open(library, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise OSError("not a 64-bit little-endian ELF file")
        section_offset, = struct.unpack_from("<Q", header, 0x28)
        entry_size, count = struct.unpack_from("<HH", header, 0x3A)
        f.seek(section_offset)
        table = f.read(entry_size * count)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * entry_size) for i in range(count)]

        def read(section: tuple) -> bytes:
            f.seek(section[4])
            return f.read(section[5])

        dynsym = next(s for s in sections if s[1] == 11)  # SHT_DYNSYM
        names = read(sections[dynsym[6]])  # its sh_link: the string table
        at = names.find(b"\0" + SYMBOL + b"\0")
        if at < 0:
            raise OSError("this torch has no isAccelerator to call")
        symbols = np.frombuffer(read(dynsym), dtype=np.dtype([("name", "<u4"), ("rest", "V20")]))
        (index,) = np.nonzero(symbols["name"] == at + 1)[0][:1]
        rela = np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")])
        for section in sections:
            if section[1] == 4 and section[6] == sections.index(dynsym):  # SHT_RELA over .dynsym
                entries = np.frombuffer(read(section), dtype=rela)
                hits = entries["offset"][(entries["info"] >> 32) == index]
                if hits.size:
                    return int(hits[0])
    raise OSError("libtorch_cpu calls isAccelerator directly, not through a slot")


def _load_address(library: str) -> int:
    """Where this process mapped the library's first byte (Linux's /proc/self/maps)."""
    real = os.path.realpath(library)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and os.path.realpath(fields[5]) == real and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16)
    raise OSError(f"{library} is not mapped in this process")


def _executable(code: bytes) -> int:
    """The address of a new read-and-execute page holding ``code``, kept for the process's life.

    Earlier pages stay: dropping one would unmap the function a patched slot calls, and the
    engine's next backward would jump into unmapped memory.
    """
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    page.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    _protect(address, mmap.PROT_READ | mmap.PROT_EXEC)
    _code_pages.append(page)
    return address


def _protect(address: int, protection: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    start = address & ~(mmap.PAGESIZE - 1)
    if libc.mprotect(ctypes.c_void_p(start), mmap.PAGESIZE, protection) != 0:
        raise OSError(ctypes.get_errno(), "mprotect refused")


def apply() -> str:
    """Point libtorch_cpu's isAccelerator slot at "is it turbine?" (once; see the module doc)."""
    global _status
    if _status == "applied":
        return _status
    if not config.fix_cuda_autograd:
        _status = "turned off (TURBINE_FIX_CUDA_AUTOGRAD=0)"
    elif not torch.backends.cuda.is_built():
        _status = "this torch has no CUDA"
    elif platform.system() != "Linux":
        _status = f"not done on {platform.system()}"
    else:
        try:
            _status = _point_slot(int(torch._C._autograd.DeviceType.PrivateUse1))
        except (OSError, ValueError, StopIteration) as error:
            _status = f"could not be applied: {error}"
    if _status != "applied":
        log.info("torch's CUDA autograd beside turbine: %s", _status)
    return _status


def _point_slot(device_type: int) -> str:
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    slot = _load_address(library) + _got_slot(library)
    function = _executable(_replacement_code(device_type))
    _protect(slot, mmap.PROT_READ | mmap.PROT_WRITE)
    ctypes.c_uint64.from_address(slot).value = function
    return "applied"
