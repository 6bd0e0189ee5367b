"""``Comm(uid, rank, world, **config)`` honours the ``CHORUS_*`` variables as
``Comm.from_env`` does: a keyword beats its variable, a variable beats the default, and a
bad variable is a ``ValueError`` naming it unless a keyword overrides it."""

import pytest

import chorus
import harness


def test_a_bad_variable_is_named_unless_a_keyword_overrides_it(monkeypatch):
    uid = chorus.UniqueId.new(1)
    monkeypatch.setenv("CHORUS_OP_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r'^CHORUS_OP_TIMEOUT="soon": '):
        chorus.Comm(uid, 0, 1)
    with pytest.raises(ValueError, match=r'^op_timeout="later": '):
        chorus.Comm(uid, 0, 1, op_timeout="later")
    with chorus.Comm(uid, 0, 1, op_timeout="5s") as comm:
        comm.barrier()


BLOCKED = r'''
comm = connect(**ARGS["config"])
if RANK == 0:
    start = time.perf_counter()
    try:
        comm.all_reduce(np.ones(4, np.float32))   # rank 1 joins it after 1.5 s
        result(raised=None, took=time.perf_counter() - start)
    except chorus.Error as e:
        result(raised=type(e).__name__, text=str(e), took=time.perf_counter() - start)
else:
    time.sleep(1.5)
    try:
        comm.all_reduce(np.ones(4, np.float32))
    except chorus.Error:
        pass
    result(raised=None)
'''


def test_the_variable_applies_to_comm():
    r0, _ = harness.run(BLOCKED, 2, timeout=60, args={"config": {}},
                        env={"CHORUS_OP_TIMEOUT": "300ms"})
    assert r0["raised"] == "Timeout", r0
    assert r0["took"] < 1.4, r0


def test_a_keyword_beats_the_variable():
    r0, _ = harness.run(BLOCKED, 2, timeout=60, args={"config": {"op_timeout": "30s"}},
                        env={"CHORUS_OP_TIMEOUT": "300ms"})
    assert r0["raised"] is None, r0
    assert r0["took"] >= 1.0, r0
