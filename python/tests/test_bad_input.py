"""Bad input is a ValueError/TypeError naming the argument and what was expected, raised
before anything is submitted; never a crash. A one-rank communicator in this process is
enough: the checks happen before any peer is involved."""

import array
import importlib.util

import numpy as np
import pytest

import chorus

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def test_non_contiguous(comm):
    a = np.zeros((4, 4), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=r"^a: expected a C-contiguous array"):
        comm.all_reduce(a)


def test_read_only_output(comm):
    a = np.zeros(4, np.float32)
    ro = np.zeros(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match=r"^out: expected a writable array"):
        comm.all_reduce(a, out=ro)
    with pytest.raises(ValueError, match=r"^a: expected a writable array"):
        comm.all_reduce(ro)
    with pytest.raises(ValueError, match=r"^a: expected a writable buffer"):
        comm.recv(b"abcd", 0)


def test_read_only_input_out_of_place_is_fine(comm):
    ro = np.arange(4, dtype=np.float32)
    ro.setflags(write=False)
    out = np.zeros(4, np.float32)
    comm.all_reduce(ro, out=out)
    assert out.tolist() == [0, 1, 2, 3]


def test_mismatched_sizes_and_dtypes(comm):
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"^out: expected 4 elements, got 5"):
        comm.all_reduce(a, out=np.zeros(5, np.float32))
    with pytest.raises(TypeError, match=r"^out: expected dtype float32 like the input, got float64"):
        comm.all_reduce(a, out=np.zeros(4, np.float64))
    with pytest.raises(ValueError, match=r"^out: expected 4 elements"):
        comm.all_gather(a, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"^out: expected an output buffer"):
        comm.all_to_all(a, None)
    with pytest.raises(ValueError, match=r"^out: expected an output buffer at the root"):
        comm.gather(a, None, root=0)


def test_rank_outside_world(comm):
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"^root: expected a rank in 0..0, got 1"):
        comm.broadcast(a, root=1)
    with pytest.raises(ValueError, match=r"^peer: expected a rank in 0..0, got -1"):
        comm.send(a, -1)
    with pytest.raises(TypeError, match=r"^root: expected an int, got float"):
        comm.reduce(a, root=0.0)
    with pytest.raises(ValueError, match=r"^rank: expected a rank in 0..1, got 2"):
        chorus.Comm(chorus.UniqueId.new(2), 2, 2)


def test_wrong_types(comm):
    with pytest.raises(TypeError, match=r"^a: expected a numpy array, a torch CPU tensor or a writable buffer"):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match=r"^a: expected an array of .*got dtype bool"):
        comm.all_reduce(np.zeros(4, bool))
    with pytest.raises(TypeError, match=r"^a: expected a buffer of .*got format 'h'"):
        comm.all_reduce(array.array("h", [1, 2]))
    with pytest.raises(ValueError, match=r'^op: expected "sum"'):
        comm.all_reduce(np.zeros(4, np.float32), op="median")
    with pytest.raises(TypeError, match=r"^factor: expected a number"):
        chorus.PreMulSum("2")
    with pytest.raises(TypeError, match=r"^uid: expected a chorus.UniqueId"):
        chorus.Comm(42, 0, 1)
    with pytest.raises(ValueError, match=r"^token: not a chorus token"):
        chorus.UniqueId("hello")


def test_overlapping_buffers(comm):
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=r"^out: expected memory separate from the input"):
        comm.all_reduce(a[:4], out=a[2:6])


def test_big_endian(comm):
    with pytest.raises(ValueError, match=r"^a: expected native \(little-endian\) byte order"):
        comm.all_reduce(np.zeros(4, ">f4"))


def test_config_keywords():
    uid = chorus.UniqueId.new(1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'heartbeat_dedline'"):
        chorus.Comm(uid, 0, 1, heartbeat_dedline="2s")
    with pytest.raises(ValueError, match=r"^heartbeat_deadline=\"fast\""):
        chorus.Comm(uid, 0, 1, heartbeat_deadline="fast")
    with pytest.raises(TypeError, match=r"^op_timeout: expected a str"):
        chorus.Comm(uid, 0, 1, op_timeout=1.5)
    assert "heartbeat_deadline" in chorus.CONFIG_KEYS and "transport" in chorus.CONFIG_KEYS


def test_buffers_work_in_place(comm):
    # bytearray, memoryview and array.array go through the buffer protocol, zero copy
    b = bytearray(b"\x01\x02\x03")
    comm.all_reduce(b, op="max")
    assert b == bytearray(b"\x01\x02\x03")
    m = memoryview(bytearray(8)).cast("f")
    comm.broadcast(m, root=0)
    arr = array.array("i", [1, 2, 3])
    comm.all_reduce(arr)
    assert list(arr) == [1, 2, 3]


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
def test_torch_bad_input(comm):
    import torch

    t = torch.zeros(4, 4)[:, 0]
    with pytest.raises(ValueError, match=r"^a: expected a contiguous tensor"):
        comm.all_reduce(t)
    with pytest.raises(TypeError, match=r"^a: expected a tensor of .*got torch.bool"):
        comm.all_reduce(torch.zeros(4, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"^out: expected dtype bfloat16 like the input, got float16"):
        comm.all_reduce(torch.zeros(4, dtype=torch.bfloat16), out=torch.zeros(4, dtype=torch.float16))


def test_destroyed(comm):
    uid = chorus.UniqueId.new(1)
    with chorus.Comm(uid, 0, 1) as c:
        c.barrier()
    with pytest.raises(chorus.Destroyed, match=r"^\[chorus:destroyed\]"):
        c.barrier()
    c.destroy()  # idempotent
