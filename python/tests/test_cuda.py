"""CUDA buffers: torch CUDA tensors, ``__cuda_array_interface__`` and ``__dlpack__`` objects
are read from their own interface (fake objects here, so the parsing is tested on the CPU),
bad ones are a ValueError/TypeError naming the argument, and without a usable device a
collective on them raises ``chorus.DeviceError`` naming what is missing. With a GPU, a
torch CUDA tensor is all-reduced on its current stream."""

import ctypes
import importlib.util
import sys

import numpy as np
import pytest

import chorus
from chorus import _cuda

HAVE_TORCH = importlib.util.find_spec("torch") is not None
NO_DEVICE = _cuda.unavailable(0)


def skip(why):
    sys.stderr.write(f"skipped: {why}\n")
    pytest.skip(why)


class FakeCai:
    """A device array as CuPy or Numba describe one (the address is never dereferenced)."""

    def __init__(self, n=8, typestr="<f4", addr=0x7F0000000000, readonly=False, strides=None, stream=None, device=None):
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": (n,),
            "typestr": typestr,
            "data": (addr, readonly),
            "strides": strides,
            "stream": stream,
        }
        if device is not None:
            self.device = device


class _Dev:
    def __init__(self, ident):
        self.id = ident


# A DLManagedTensor in host memory, handed out in a real "dltensor" capsule.
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_NAME = b"dltensor"


class FakeDlpack:
    def __init__(self, shape=(4, 2), code=2, bits=32, device=(2, 1), strides=None, data=0x7E0000000000, offset=64):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        t = _cuda._DLManagedTensor()
        t.dl_tensor.data = data
        t.dl_tensor.device.device_type, t.dl_tensor.device.device_id = device
        t.dl_tensor.ndim = len(shape)
        t.dl_tensor.dtype.code, t.dl_tensor.dtype.bits, t.dl_tensor.dtype.lanes = code, bits, 1
        t.dl_tensor.shape = self.shape
        t.dl_tensor.strides = self.strides
        t.dl_tensor.byte_offset = offset
        self.managed = t
        self.device = device
        self.streams = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return _new_capsule(ctypes.addressof(self.managed), _NAME, None)


def test_cuda_array_interface_is_read_as_is():
    b = _cuda.describe(FakeCai(8, "<f4", stream=2, device=_Dev(3)), "a", writable=True)
    assert (b.addr, b.nbytes, b.numel, b.dtype_name) == (0x7F0000000000, 32, 8, "float32")
    assert b.dtype == chorus._chorus.DTYPES["float32"][0]
    assert (b.keep.device, b.keep.stream) == (3, 2)
    # No stream (or 1): the legacy default stream, handle 0; no device: the communicator's.
    b = _cuda.describe(FakeCai(4, "|u1"), "a", writable=False)
    assert (b.keep.stream, b.keep.device, b.dtype_name, b.nbytes) == (0, None, "uint8", 4)
    assert _cuda.describe(FakeCai(2, "<i8", stream=1), "a", writable=False).keep.stream == 0


def test_bad_cuda_array_interfaces_name_the_argument():
    with pytest.raises(ValueError, match=r"^out: expected writable device memory"):
        _cuda.describe(FakeCai(readonly=True), "out", writable=True)
    with pytest.raises(ValueError, match=r"^a: expected C-contiguous device memory"):
        _cuda.describe(FakeCai(8, "<f4", strides=(8,)), "a", writable=False)
    with pytest.raises(TypeError, match=r"^a: expected device memory of .*got typestr <c8"):
        _cuda.describe(FakeCai(8, "<c8"), "a", writable=False)
    with pytest.raises(ValueError, match=r"^a: expected native \(little-endian\)"):
        _cuda.describe(FakeCai(8, ">f4"), "a", writable=False)
    with pytest.raises(ValueError, match=r"^a: __cuda_array_interface__ stream 0"):
        _cuda.describe(FakeCai(stream=0), "a", writable=False)

    class Broken:
        __cuda_array_interface__ = {"shape": (2,)}

    with pytest.raises(TypeError, match=r"^a: __cuda_array_interface__ lacks"):
        _cuda.describe(Broken(), "a", writable=False)


def test_dlpack_capsules_are_parsed_on_the_legacy_stream():
    f = FakeDlpack()
    b = _cuda.describe(f, "a", writable=True)
    assert (b.addr, b.nbytes, b.numel, b.dtype_name) == (0x7E0000000000 + 64, 32, 8, "float32")
    assert (b.keep.device, b.keep.stream) == (1, 0)
    assert f.streams == [1], "asked for the legacy default stream"
    # Compact strides (in elements) are contiguous; others are not.
    assert _cuda.describe(FakeDlpack(strides=(2, 1)), "a", writable=False).numel == 8
    with pytest.raises(ValueError, match=r"^a: expected C-contiguous"):
        _cuda.describe(FakeDlpack(strides=(1, 4)), "a", writable=False)
    assert _cuda.describe(FakeDlpack(code=4, bits=16), "a", writable=False).dtype_name == "bfloat16"
    with pytest.raises(TypeError, match=r"^a: expected device memory of .*DLPack type \(5, 64"):
        _cuda.describe(FakeDlpack(code=5, bits=64), "a", writable=False)
    # Memory on the host is not this module's: the host path takes it.
    assert _cuda.describe(FakeDlpack(device=(1, 0)), "a", writable=False) is None
    assert _cuda.describe(np.zeros(4, np.float32), "a", writable=False) is None


def test_host_and_device_memory_in_one_call_is_refused(comm):
    with pytest.raises(ValueError, match=r"^buffers: expected every buffer of a call on the same device"):
        comm.all_reduce(FakeCai(4, "<f4"), out=np.zeros(4, np.float32))


def test_a_collective_without_a_usable_device_raises_device_error(comm):
    if NO_DEVICE is None:
        skip("the no-device error: this machine has a usable GPU")
    with pytest.raises(chorus.DeviceError, match=r"device unavailable") as e:
        comm.all_reduce(FakeCai(8, "<f4"))
    assert str(e.value).startswith("[chorus:device]")
    assert "cuda:0" in str(e.value)
    # The host communicator is untouched.
    a = np.ones(4, np.float32)
    comm.all_reduce(a)
    assert a.tolist() == [1.0] * 4


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_a_torch_cuda_tensor_is_all_reduced_on_its_stream(comm):
    import torch

    if not torch.cuda.is_available() or NO_DEVICE is not None:
        skip(f"torch CUDA tensors through chorus.Comm: no usable GPU ({NO_DEVICE or 'torch sees none'})")
    t = torch.arange(1 << 16, dtype=torch.float32, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t.mul_(2)
        comm.all_reduce(t)
        t.add_(1)
    torch.cuda.synchronize()
    assert torch.equal(t, torch.arange(1 << 16, dtype=torch.float32, device="cuda") * 2 + 1)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
def test_the_torch_backend_registers_cuda_and_names_what_it_cannot_take():
    import torch
    import torch.distributed as dist

    import chorus.torch as ct
    from chorus.torch import _ops

    assert "cuda" in dist.Backend.backend_capability[ct.BACKEND.lower()]
    with pytest.raises(ValueError, match=r"^tensor: the chorus backend takes CPU and CUDA tensors, got a tensor on meta"):
        _ops.check_tensor(torch.ones(2, device="meta"), "tensor")
