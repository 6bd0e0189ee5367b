"""The blocking all-reduce's fast path (``_chorus.Comm.all_reduce_now``): the extension
describes numpy arrays itself, through ``__array_struct__``, and takes exactly the arrays
the general path would take without a copy; it declines everything else (returns False,
running nothing), which the general path then takes or refuses with its own message. A
one-rank communicator is enough: what is decided here happens before any peer."""

import importlib.util

import numpy as np
import pytest

import chorus

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def now(comm, a, out=None, op="sum"):
    return comm._c.all_reduce_now(a, out, op)


if HAVE_TORCH:
    import torch as _torch

    class TensorSub(_torch.Tensor):
        """A tensor subclass (``nn.Parameter``'s shape): not a plain tensor."""


def declined_tensors(torch):
    """Tensors both fast paths decline, by what is wrong with them; the general path
    takes them or names the problem."""
    return {
        "strided": torch.zeros(8)[::2],
        "transposed": torch.zeros(3, 2).t(),
        "complex": torch.zeros(4, dtype=torch.complex64),
        "bool": torch.zeros(4, dtype=torch.bool),
        "int16": torch.zeros(4, dtype=torch.int16),
        "sparse": torch.zeros(4).to_sparse(),
        "meta": torch.zeros(4, device="meta"),
    }


@pytest.mark.parametrize(
    "dtype", ["float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64"]
)
def test_takes_every_native_dtype(comm, dtype):
    a = np.arange(6, dtype=dtype).reshape(2, 3)
    assert now(comm, a)
    out = np.zeros_like(a)
    assert now(comm, a, out)
    assert (out == a).all()


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_takes_every_plain_reduction(comm, op):
    a = np.full(4, 3.0, np.float32)
    assert now(comm, a, op=op)
    assert (a == 3.0).all()


def test_takes_views_and_empty_arrays(comm):
    whole = np.arange(8, dtype=np.float32)
    assert now(comm, whole[2:5])
    assert now(comm, np.zeros(0, np.float32))
    assert now(comm, np.zeros((3, 0), np.float64), np.zeros((3, 0), np.float64))
    assert now(comm, np.ones((), np.float32))  # 0-d


def test_takes_a_read_only_input_out_of_place(comm):
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)
    out = np.zeros(4, np.float32)
    assert now(comm, ro, out)
    assert (out == 1.0).all()


class Sub(np.ndarray):
    pass


def declined():
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)
    cases = {
        "list": ([1.0, 2.0], None, "sum"),
        "bytearray": (bytearray(8), None, "sum"),
        "strided": (np.zeros(8, np.float32)[::2], None, "sum"),
        "fortran": (np.zeros((3, 2), np.float32, order="F"), None, "sum"),
        "big-endian": (np.zeros(4, ">f4"), None, "sum"),
        "bool": (np.zeros(4, bool), None, "sum"),
        "int16": (np.zeros(4, np.int16), None, "sum"),
        "complex": (np.zeros(4, np.complex64), None, "sum"),
        "read-only in place": (ro, None, "sum"),
        "read-only out": (np.zeros(4, np.float32), ro, "sum"),
        "out of another dtype": (np.zeros(4, np.float32), np.zeros(4, np.float64), "sum"),
        "out of another size": (np.zeros(4, np.float32), np.zeros(5, np.float32), "sum"),
        "out a list": (np.zeros(4, np.float32), [0.0] * 4, "sum"),
        "a subclass": (np.zeros(4, np.float32).view(Sub), None, "sum"),
        "premulsum": (np.zeros(4, np.float32), None, chorus.PreMulSum(2.0)),
        "unknown op": (np.zeros(4, np.float32), None, "band"),
        "op not a str": (np.zeros(4, np.float32), None, 1),
    }
    return cases


@pytest.mark.parametrize("case", sorted(declined()))
def test_declines_what_the_general_path_decides(comm, case):
    a, out, op = declined()[case]
    before = comm._c._calls()
    assert now(comm, a, out, op) is False
    assert comm._c._calls() == before, "a declined call runs nothing"


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_takes_exactly_the_tensors_the_python_fast_path_takes(comm):
    """The extension's tensor description (``tensor.rs``) and ``_buffers._tensor_fast``
    must take the same tensors: every dtype both carry, in place and out of place, and
    nothing the Python twin declines."""
    import torch

    from chorus import _buffers

    names = [n for n in _buffers._DTYPES if isinstance(getattr(torch, n, None), torch.dtype)]
    for dtype_name in names:
        t = torch.zeros(6, dtype=getattr(torch, dtype_name)).reshape(2, 3)
        before = comm._c._calls()
        # fp8 sums are the engine's own; max works on every dtype.
        assert now(comm, t, op="max") is True, dtype_name
        assert now(comm, t, torch.zeros_like(t), op="max") is True, dtype_name
        assert comm._c._calls()[0] == before[0] + 2, dtype_name

    declined = declined_tensors(torch)
    for case, t in declined.items():
        assert _buffers._tensor_fast(torch, t) is None, case
    # Not plain tensors: the Python twin never sees them (``describe`` checks the type).
    declined["subclass"] = torch.zeros(4).as_subclass(TensorSub)
    declined["parameter"] = torch.nn.Parameter(torch.zeros(4))
    for case, t in declined.items():
        before = comm._c._calls()
        assert now(comm, t) is False, case
        assert comm._c._calls() == before, f"{case}: a declined call runs nothing"
    # Unlike in dtype or size from the input: the general path says how.
    assert now(comm, torch.zeros(4), torch.zeros(4, dtype=torch.float64)) is False
    assert now(comm, torch.zeros(4), torch.zeros(5)) is False


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_a_tensor_reduces_in_its_own_memory_through_the_extension(comm):
    import torch

    t = torch.arange(6, dtype=torch.float32)
    ptr = t.data_ptr()
    assert now(comm, t[2:], op="avg") is True  # a contiguous view, at its own offset
    assert t.data_ptr() == ptr and t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    out = torch.full((4,), -1.0)
    assert now(comm, t[2:], out) is True
    assert out.tolist() == [2.0, 3.0, 4.0, 5.0]
    whole = torch.zeros(8)
    with pytest.raises(ValueError, match=r"^out: expected memory separate from the input"):
        now(comm, whole[:4], whole[2:6])
    with pytest.raises(ValueError, match=r"^timeout"):
        comm._c.all_reduce_now(torch.zeros(4), None, "sum", -1.0)


def test_overlapping_out_is_refused_as_on_the_general_path(comm):
    whole = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=r"^out: expected memory separate from the input"):
        now(comm, whole[:4], whole[2:6])
    with pytest.raises(ValueError, match=r"^out: expected memory separate from the input"):
        comm.all_reduce(whole[:4], out=whole[2:6])


def test_comm_all_reduce_takes_it_for_numpy_and_runs_inline(comm):
    a = np.ones(4, np.float32)
    inline, queued = comm._c._calls()
    comm.all_reduce(a)
    comm.all_reduce(a, out=np.empty_like(a), op="max")
    assert comm._c._calls() == (inline + 2, queued)


def test_a_destroyed_comm_raises_destroyed():
    c = chorus.Comm(chorus.UniqueId.new(1), 0, 1)
    c.destroy()
    with pytest.raises(chorus.Destroyed):
        c.all_reduce(np.zeros(4, np.float32))


# --- torch CPU tensors: ``_buffers._tensor_fast`` ------------------------------------------


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_the_tensor_fast_path_describes_a_tensor_as_the_general_path_does():
    import torch

    from chorus import _buffers

    names = [n for n in _buffers._DTYPES if isinstance(getattr(torch, n, None), torch.dtype)]
    assert {"float32", "bfloat16", "float16", "int64"} <= set(names)
    for dtype_name in names:
        t = torch.zeros(6, dtype=getattr(torch, dtype_name)).reshape(2, 3)
        fast = _buffers._tensor_fast(torch, t)
        assert fast is not None, dtype_name
        assert fast == _buffers._tensor(t, "a"), dtype_name
        assert _buffers.describe(t, "a", writable=True) == fast
        assert fast.addr == t.data_ptr() and fast.keep is t


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_the_tensor_fast_path_declines_what_the_general_path_decides():
    import torch

    from chorus import _buffers

    declined = declined_tensors(torch)
    for case, t in declined.items():
        assert _buffers._tensor_fast(torch, t) is None, case
    # The general path still names what is wrong with them.
    with pytest.raises(ValueError, match=r"^a: expected a contiguous tensor"):
        _buffers.describe(declined["strided"], "a", writable=True)
    with pytest.raises(TypeError, match=r"^a: expected a tensor of .*complex64"):
        _buffers.describe(declined["complex"], "a", writable=True)
    # A subclass (nn.Parameter's shape) is not a plain tensor: the general path takes it.
    sub = torch.zeros(4).as_subclass(TensorSub)
    assert _buffers.describe(sub, "a", writable=True).addr == sub.data_ptr()


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_comm_all_reduce_on_a_tensor_lands_in_its_memory(comm):
    import torch

    t = torch.arange(4, dtype=torch.float32)
    ptr = t.data_ptr()
    comm.all_reduce(t, op="max")
    assert t.data_ptr() == ptr and t.tolist() == [0.0, 1.0, 2.0, 3.0]
    out = torch.empty(4)
    comm.all_reduce(t, out=out)
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
