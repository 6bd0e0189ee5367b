"""Errors: one class per kind, the stable token first, structured attributes, and pickling
that keeps the class, the token and the fields (as Ray and multiprocessing move them)."""

import pickle

import numpy as np
import pytest

import chorus

KINDS = {
    chorus.Aborted: "aborted",
    chorus.PeerFailed: "peer-failed",
    chorus.PeerDeparted: "peer-departed",
    chorus.Timeout: "timeout",
    chorus.Revoked: "revoked",
    chorus.Evicted: "evicted",
    chorus.Mismatch: "mismatch",
    chorus.InvalidArgument: "invalid-argument",
    chorus.ConfigError: "config",
    chorus.Bootstrap: "bootstrap",
    chorus.TransportError: "transport",
    chorus.ProtocolError: "protocol",
    chorus.DeviceError: "device",
    chorus.Destroyed: "destroyed",
    chorus.NoQuorum: "no-quorum",
    chorus.InternalError: "internal",
}


@pytest.mark.parametrize("cls,kind", list(KINDS.items()))
def test_classes_and_pickling(cls, kind):
    assert issubclass(cls, chorus.Error) and issubclass(cls, RuntimeError)
    e = cls(f"[chorus:{kind}] all-reduce op 7 on r1@0: boom (peer r2)", kind=kind, rank=1, peer=2,
            epoch=0, collective="all-reduce", step=3, evidence="process exited (signal 9)",
            partial=True, waiting_on=2)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls
    assert str(back) == str(e) and str(back).startswith(f"[chorus:{kind}]")
    assert (back.kind, back.rank, back.peer, back.epoch, back.collective, back.step,
            back.evidence, back.partial, back.waiting_on) == (
        kind, 1, 2, 0, "all-reduce", 3, "process exited (signal 9)", True, 2)
    assert type(chorus.from_text(str(e))) is cls


def test_invalid_argument_is_a_value_error():
    assert issubclass(chorus.InvalidArgument, ValueError)


def test_a_real_error_from_rust_pickles():
    uid = chorus.UniqueId.new(1)
    comm = chorus.Comm(uid, 0, 1)
    comm.abort("watchdog says so")
    # chorus refuses calls on an aborted communicator (a blocked call gets Aborted: see
    # test_interrupt.py)
    with pytest.raises(chorus.Destroyed) as info:
        comm.all_reduce(np.zeros(4, np.float32))
    e = info.value
    assert str(e).startswith("[chorus:destroyed]")
    assert e.kind == "destroyed" and e.rank == 0 and e.epoch == 0
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is chorus.Destroyed and str(back) == str(e) and back.rank == 0
    comm.destroy()


def test_unique_id_round_trips():
    uid = chorus.UniqueId.new(1)
    token = str(uid)
    assert token.startswith("chorus1-")
    assert chorus.UniqueId(token) == uid
    assert pickle.loads(pickle.dumps(uid)) == uid
    assert "secret" not in repr(uid) and token not in repr(uid)
