"""What a collective's buffers are: address, size and element type, read from the object's
own interface without copying.

- torch tensors (CPU, contiguous): ``data_ptr()``, ``dtype`` (bfloat16 and the fp8 types
  included, which numpy has no type for), a plain ``torch.Tensor`` by a short path;
- numpy arrays and anything with ``__array_interface__`` (ml_dtypes' bfloat16/fp8 too);
- anything else with the buffer protocol (``bytearray``, ``memoryview``, ``array.array``):
  through ``memoryview`` and ctypes, which holds a buffer export while the operation runs
  (a ``bytearray`` cannot be resized under it).

The object itself rides with the operation until it finishes, so its memory cannot be
freed under the transfer.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, NamedTuple, Optional, Tuple

from . import _chorus, _cuda

# {name: (wire code, bytes per element)}, from the extension.
_DTYPES = _chorus.DTYPES

# memoryview format characters (native byte order, as the buffer protocol gives them).
_FORMATS = {
    "b": "int8",
    "B": "uint8",
    "c": "uint8",
    "e": "float16",
    "f": "float32",
    "d": "float64",
}


class Buf(NamedTuple):
    addr: int
    nbytes: int
    dtype: int  # wire code
    dtype_name: str
    numel: int
    keep: Any  # what owns the memory

    @property
    def raw(self) -> Tuple[int, int]:
        return (self.addr, self.nbytes)


def describe(obj: Any, name: str, *, writable: bool) -> Buf:
    """``obj`` as a buffer; ``ValueError``/``TypeError`` naming ``name`` when it cannot
    be one (or cannot be written to when ``writable``). CUDA memory is described by
    ``chorus._cuda``."""
    ndarray = _NP[0] or _load_numpy()
    if type(obj) is ndarray:
        # The common case, kept short: this runs on every call (see _ndarray_fast).
        fast = _ndarray_fast(obj, writable)
        if fast is not None:
            return fast
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor:
        # The other common case: a plain CPU tensor, without the general path's device
        # probe and dtype name (about 3 us a call).
        fast = _tensor_fast(torch, obj)
        if fast is not None:
            return fast
    device = _cuda.describe(obj, name, writable=writable)
    if device is not None:
        return device  # type: ignore[return-value]
    if torch is not None and isinstance(obj, torch.Tensor):
        return _tensor(obj, name)
    ai = getattr(obj, "__array_interface__", None)
    if isinstance(ai, dict):
        return _array(obj, ai, name, writable)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{name}: expected a numpy array, a torch CPU tensor or a writable buffer "
            f"(bytearray, memoryview), got {type(obj).__name__}"
        ) from None
    return _view(obj, view, name, writable)


# numpy's array type and ``{dtype: (wire code, bytes, name)}`` for the dtypes numpy has
# natively, in native byte order: the fast path's table, filled once numpy is loaded (chorus
# never imports numpy itself).
_NP: list = [None, {}]


def _load_numpy() -> Any:
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    codes = {}
    for dtype_name, (code, size) in _DTYPES.items():
        try:
            dt = numpy.dtype(dtype_name)
        except TypeError:
            continue  # bfloat16 and fp8: ml_dtypes' types go through _array
        if dt.isnative:
            codes[dt] = (code, size, dtype_name)
    _NP[1] = codes
    _NP[0] = numpy.ndarray
    return numpy.ndarray


def _ndarray_fast(a: Any, writable: bool) -> Optional[Buf]:
    """A C-contiguous, native-order numpy array of a dtype numpy has natively, in about a
    microsecond (a dtype's ``name`` alone costs more than that); None for anything else,
    which the general path then describes or refuses with the right message."""
    code = _NP[1].get(a.dtype)
    if code is None:
        return None
    ai = a.__array_interface__
    addr, readonly = ai["data"]
    if ai["strides"] is not None or (writable and readonly):
        return None
    numel = a.size
    return Buf(addr or 0, numel * code[1], code[0], code[2], numel, a)


# ``{torch dtype: (wire code, bytes, name)}``, filled once torch is loaded (chorus never
# imports torch itself): the tensor fast path's table.
_TORCH: list = [None, {}]


def _tensor_fast(torch: Any, t: Any) -> Optional[Buf]:
    """A contiguous, strided CPU tensor of a dtype chorus has; None for anything else,
    which the general path then describes or refuses with the right message."""
    if _TORCH[0] is not torch:
        codes = {}
        for dtype_name, (code, size) in _DTYPES.items():
            dt = getattr(torch, dtype_name, None)
            if isinstance(dt, torch.dtype) and str(dt) == f"torch.{dtype_name}":
                codes[dt] = (code, size, dtype_name)
        _TORCH[1] = codes
        _TORCH[0] = torch
    code = _TORCH[1].get(t.dtype)
    if code is None or not t.is_cpu or t.layout is not torch.strided or not t.is_contiguous():
        return None
    numel = t.numel()
    return Buf(t.data_ptr(), numel * code[1], code[0], code[2], numel, t)


def _tensor(t: Any, name: str) -> Buf:
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, got one on {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous())")
    dtype = str(t.dtype)
    if dtype.startswith("torch."):
        dtype = dtype[len("torch."):]
    code = _DTYPES.get(dtype)
    if code is None:
        raise TypeError(f"{name}: expected a tensor of {_names()}, got {t.dtype}")
    numel = t.numel()
    return Buf(t.data_ptr(), numel * code[1], code[0], dtype, numel, t)


def _array(obj: Any, ai: dict, name: str, writable: bool) -> Buf:
    addr, readonly = ai["data"]
    if writable and readonly:
        raise ValueError(f"{name}: expected a writable array, got a read-only one")
    dtype_obj = getattr(obj, "dtype", None)
    dtype = getattr(dtype_obj, "name", None) or ai["typestr"]
    code = _DTYPES.get(dtype)
    if code is None:
        raise TypeError(f"{name}: expected an array of {_names()}, got dtype {dtype}")
    if ai["typestr"][:1] == ">" and code[1] > 1:
        raise ValueError(f"{name}: expected native (little-endian) byte order, got {dtype} big-endian")
    shape = ai["shape"]
    numel = 1
    for n in shape:
        numel *= n
    strides = ai.get("strides")
    if strides is not None and numel > 1:
        expected = code[1]
        for n, s in zip(reversed(shape), reversed(strides)):
            if n > 1 and s != expected:
                raise ValueError(
                    f"{name}: expected a C-contiguous array (numpy.ascontiguousarray), "
                    f"got strides {tuple(strides)}"
                )
            expected *= n
    return Buf(addr or 0, numel * code[1], code[0], dtype, numel, obj)


def _view(obj: Any, view: memoryview, name: str, writable: bool) -> Buf:
    if not view.c_contiguous:
        raise ValueError(f"{name}: expected a contiguous buffer")
    fmt = view.format.lstrip("@=<")
    dtype: Optional[str] = _FORMATS.get(fmt)
    if dtype is None and fmt.lower() in ("h", "i", "l", "q", "n"):
        signed = fmt.islower()
        dtype = f"{'' if signed else 'u'}int{view.itemsize * 8}"
    code = _DTYPES.get(dtype or "")
    if code is None or code[1] != view.itemsize:
        raise TypeError(f"{name}: expected a buffer of {_names()}, got format {view.format!r}")
    nbytes = view.nbytes
    if view.readonly:
        if writable:
            raise ValueError(f"{name}: expected a writable buffer, got a read-only one")
        addr, keep = _readonly_address(obj, view, name)
    elif nbytes == 0:
        addr, keep = 0, (obj, view)
    else:
        holder = (ctypes.c_char * nbytes).from_buffer(view)
        addr, keep = ctypes.addressof(holder), (obj, view, holder)
    return Buf(addr, nbytes, code[0], dtype or "", nbytes // code[1], keep)


def _readonly_address(obj: Any, view: memoryview, name: str) -> Tuple[int, Any]:
    if isinstance(obj, bytes):
        # A bytes object's storage, without a copy (ctypes points at it directly).
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value or 0, obj
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        arr = numpy.frombuffer(view, dtype=numpy.uint8)
        return arr.__array_interface__["data"][0], (obj, view, arr)
    raise TypeError(f"{name}: a read-only buffer here needs numpy (or pass bytes or a bytearray)")


def _names() -> str:
    return ", ".join(sorted(_DTYPES))
