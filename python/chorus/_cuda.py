"""CUDA device buffers: what a collective's device memory is, read from the object's own
interface without copying, and the communicator's device half that runs on it.

- torch CUDA tensors (contiguous): ``data_ptr()``, ``dtype``, ``device.index``, and the
  tensor's current stream (``torch.cuda.current_stream(device)``);
- anything with ``__cuda_array_interface__`` (CuPy, Numba, JAX): ``data``, ``typestr``,
  ``shape``/``strides`` and its ``stream`` (version 3; 1 and None mean the legacy default
  stream, 2 the per-thread default);
- anything with ``__dlpack__``/``__dlpack_device__`` on a CUDA device: the capsule's
  ``DLTensor``, asked for on the legacy default stream, which the operation then uses.

The object (and a DLPack capsule) rides with the operation until it has completed on the
device. A collective whose buffers are on a device runs on ``comm``'s device communicator
(``chorus._chorus.CudaComm``, a split of ``comm`` made at the first device collective; every
member makes it at the same call), ordered after the work on that stream and recorded on
it; without a usable device the call raises ``chorus.DeviceError`` naming what is missing.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, List, NamedTuple, Optional, Tuple

from . import _chorus

_DTYPES = _chorus.DTYPES

# DLPack device types with memory a CUDA kernel can read.
_DL_CUDA = 2
_DL_CUDA_MANAGED = 13
# DLPack's legacy default stream in `__dlpack__(stream=...)` (0 is not allowed for CUDA).
_DL_LEGACY_STREAM = 1

# (DLPack type code, bits) -> dtype name. Codes from dlpack.h (1.1: float8 kinds).
_DL_TYPES = {
    (0, 8): "int8",
    (0, 32): "int32",
    (0, 64): "int64",
    (1, 8): "uint8",
    (1, 32): "uint32",
    (1, 64): "uint64",
    (2, 16): "float16",
    (2, 32): "float32",
    (2, 64): "float64",
    (4, 16): "bfloat16",
    (10, 8): "float8_e4m3fn",
    (12, 8): "float8_e5m2",
}

# `__cuda_array_interface__` typestr (without byte order) -> dtype name.
_TYPESTRS = {
    "i1": "int8",
    "u1": "uint8",
    "i4": "int32",
    "u4": "uint32",
    "i8": "int64",
    "u8": "uint64",
    "f2": "float16",
    "f4": "float32",
    "f8": "float64",
}


class Held:
    """What owns a device buffer's memory while its operation runs, and where it lives."""

    __slots__ = ("obj", "device", "stream")

    def __init__(self, obj: Any, device: Optional[int], stream: int) -> None:
        self.obj = obj
        self.device = device
        self.stream = stream


class DeviceBuf(NamedTuple):
    addr: int
    nbytes: int
    dtype: int  # wire code
    dtype_name: str
    numel: int
    keep: Held

    @property
    def raw(self) -> Tuple[int, int]:
        return (self.addr, self.nbytes)


def describe(obj: Any, name: str, *, writable: bool) -> Optional[DeviceBuf]:
    """``obj`` as device memory, or None when it is not CUDA memory (the host path takes
    it); ``ValueError``/``TypeError`` naming ``name`` when it is CUDA memory that cannot
    be used."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cuda":
            return None
        return _tensor(torch, obj, name)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _interface(obj, cai, name, writable)
    where = getattr(obj, "__dlpack_device__", None)
    if callable(where) and callable(getattr(obj, "__dlpack__", None)):
        kind, device = where()
        if kind in (_DL_CUDA, _DL_CUDA_MANAGED):
            return _dlpack(obj, int(device), name)
    return None


def _tensor(torch: Any, t: Any, name: str) -> DeviceBuf:
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous())")
    dtype = str(t.dtype)
    if dtype.startswith("torch."):
        dtype = dtype[len("torch."):]
    code = _code(dtype, name, f"a tensor of {t.dtype}")
    device = t.device.index if t.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(t.device).cuda_stream
    numel = t.numel()
    return DeviceBuf(t.data_ptr(), numel * code[1], code[0], dtype, numel, Held(t, device, stream))


def _interface(obj: Any, cai: Any, name: str, writable: bool) -> DeviceBuf:
    if not isinstance(cai, dict):
        raise TypeError(f"{name}: __cuda_array_interface__ is not a dict")
    try:
        addr, readonly = cai["data"]
        shape = tuple(cai["shape"])
        typestr = cai["typestr"]
    except (KeyError, TypeError, ValueError):
        raise TypeError(f"{name}: __cuda_array_interface__ lacks data, shape or typestr") from None
    if writable and readonly:
        raise ValueError(f"{name}: expected writable device memory, got a read-only array")
    if not isinstance(typestr, str) or len(typestr) < 3:
        raise TypeError(f"{name}: __cuda_array_interface__ typestr {typestr!r} is not a type")
    order, kind = typestr[0], typestr[1:]
    named = getattr(getattr(obj, "dtype", None), "name", None)
    dtype = named if named in _DTYPES else _TYPESTRS.get(kind)
    code = _code(dtype, name, f"typestr {typestr}")
    if order == ">" and code[1] > 1:
        raise ValueError(f"{name}: expected native (little-endian) byte order, got {typestr}")
    if cai.get("mask") is not None:
        raise ValueError(f"{name}: expected an array without a mask")
    numel = _contiguous(shape, cai.get("strides"), code[1], name)
    stream = _interface_stream(cai.get("stream"), name)
    device = _device_id(getattr(obj, "device", None))
    return DeviceBuf(int(addr or 0), numel * code[1], code[0], dtype or "", numel, Held(obj, device, stream))


def _interface_stream(stream: Any, name: str) -> int:
    # Version 3: None (no ordering needed) and 1 are the legacy default stream, 2 the
    # per-thread default (its driver handle is 2 too); 0 is ambiguous and disallowed.
    if stream is None or stream == 1:
        return 0
    if isinstance(stream, bool) or not isinstance(stream, int) or stream <= 0:
        raise ValueError(f"{name}: __cuda_array_interface__ stream {stream!r} is not a stream")
    return stream


def _device_id(device: Any) -> Optional[int]:
    # CuPy: `.device.id`; others may give an int or nothing (then: the communicator's).
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    ident = getattr(device, "id", None)
    return ident if isinstance(ident, int) else None


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack(obj: Any, device: int, name: str) -> DeviceBuf:
    capsule = obj.__dlpack__(stream=_DL_LEGACY_STREAM)
    if not _capsule_valid(capsule, b"dltensor"):
        raise TypeError(f"{name}: __dlpack__ returned no unconsumed 'dltensor' capsule")
    # The capsule stays unconsumed (not renamed): its own destructor frees the tensor once
    # the operation lets go of it.
    managed = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    t = managed.dl_tensor
    if t.device.device_type not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise ValueError(f"{name}: expected CUDA memory, got DLPack device type {t.device.device_type}")
    if t.dtype.lanes != 1:
        raise TypeError(f"{name}: expected one lane per element, got {t.dtype.lanes}")
    dtype = _DL_TYPES.get((t.dtype.code, t.dtype.bits))
    code = _code(dtype, name, f"DLPack type ({t.dtype.code}, {t.dtype.bits} bits)")
    if t.ndim < 0:
        raise ValueError(f"{name}: DLPack tensor with {t.ndim} dimensions")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * code[1] for i in range(t.ndim))
    numel = _contiguous(shape, strides, code[1], name)
    addr = (t.data or 0) + t.byte_offset
    return DeviceBuf(addr, numel * code[1], code[0], dtype or "", numel, Held((obj, capsule), t.device.device_id, 0))


def _contiguous(shape: Tuple[int, ...], strides: Any, itemsize: int, name: str) -> int:
    numel = 1
    for n in shape:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{name}: shape {shape} is not a shape")
        numel *= n
    if strides is not None and numel > 1:
        expected = itemsize
        for n, s in zip(reversed(shape), reversed(tuple(strides))):
            if n > 1 and s != expected:
                raise ValueError(f"{name}: expected C-contiguous device memory, got strides {tuple(strides)}")
            expected *= n
    return numel


def _code(dtype: Optional[str], name: str, got: str) -> Tuple[int, int]:
    code = _DTYPES.get(dtype or "")
    if code is None:
        raise TypeError(f"{name}: expected device memory of {', '.join(sorted(_DTYPES))}, got {got}")
    return code


# -- the device half of a communicator ----------------------------------------------------


def held(keep: Any) -> List[Held]:
    """Every device buffer's owner among an operation's (or group's) `keep`."""
    out: List[Held] = []
    stack = [keep]
    while stack:
        k = stack.pop()
        if isinstance(k, Held):
            out.append(k)
        elif isinstance(k, (tuple, list)):
            stack.extend(k)
    return out


def submit(comm: Any, ops: List[tuple], group: bool, keep: Any) -> Any:
    """Submits `ops` where their memory lives: the host communicator when no buffer is
    on a device, else its device communicator, on the first buffer's stream."""
    devices = held(keep)
    if not devices:
        return comm._c.submit(ops, group, keep, None)
    if _host_kept(keep):
        raise ValueError("buffers: expected every buffer of a call on the same device, got host and device memory")
    ordinals = {h.device for h in devices if h.device is not None}
    if len(ordinals) > 1:
        raise ValueError(f"buffers: expected every buffer on one CUDA device, got devices {sorted(ordinals)}")
    device = _device_comm(comm, next(iter(ordinals), None))
    return device.submit(ops, group, keep, devices[-1].stream)


def _host_kept(keep: Any) -> bool:
    # A host buffer's owner is anything but a `Held` (None stands for "no buffer").
    stack = [keep]
    while stack:
        k = stack.pop()
        if isinstance(k, (tuple, list)):
            stack.extend(k)
        elif k is not None and not isinstance(k, Held):
            return True
    return False


def _device_comm(comm: Any, ordinal: Optional[int]) -> Any:
    """`comm`'s device communicator, made at the first device collective (every member
    makes it at the same call: it is a split of `comm`)."""
    dev = getattr(comm, "_cuda_comm", None)
    if dev is not None:
        if ordinal is not None and dev[0] != ordinal:
            raise ValueError(
                f"buffers: this communicator runs on cuda:{dev[0]}, got memory on cuda:{ordinal}"
            )
        return dev[1]
    if ordinal is None:
        ordinal = 0
    # Host operations still queued must not run beside the split's own collective: a
    # barrier behind them drains the queue first, at the same point on every member.
    comm._c.submit([("barrier", None, None, 0, 0, "sum", 0.0, 0)], False, None).wait()
    inner = _chorus.CudaComm(comm._c, ordinal)
    comm._cuda_comm = (ordinal, inner)
    return inner


def close(comm: Any, timeout: float = 30.0) -> None:
    """Lets `comm`'s device communicator finish what is queued (bounded) before `comm`
    itself is destroyed."""
    dev = getattr(comm, "_cuda_comm", None)
    if dev is not None:
        comm._cuda_comm = None
        dev[1].close(timeout)


def unavailable(device: int = 0) -> Optional[str]:
    """None if CUDA device `device` is usable in this process, else why not (the
    ``[chorus:device]`` text ``chorus.DeviceError`` would carry)."""
    return _chorus.cuda_unavailable(device)
