"""How calls reach the engine and what a ``Work`` promises: a blocking call on an idle
communicator runs inline (on the caller's thread) and one behind unfinished works goes
through the queue, in call order either way, even when another thread submits during an
inline call; done callbacks; a call's ``timeout``; and what dropping an unfinished
``Work`` does (nothing harmful)."""

import pytest

import harness

ORDER = r'''
comm = connect()
other = 1 - RANK
def ar(n, v, **kw):
    a = np.full(n, float(v), np.float32)
    w = comm.all_reduce(a, **kw)
    return a, w
def calls():
    return comm._c._calls()

# 1. idle: blocking calls run inline
before = calls()
for _ in range(5):
    a, _ = ar(16, RANK + 1)
inline_idle = calls()[0] - before[0]
idle_ok = bool((a == 3).all())

# 2. behind unfinished works, a blocking call queues behind them (and so runs after them)
if RANK == 1:
    time.sleep(0.3)                      # rank 0's works are still unfinished when it calls
before = calls()
bufs = [np.full(1000 + k, float(RANK + k), np.float32) for k in range(4)]
works = [comm.all_reduce(b, async_op=True) for b in bufs]
a, _ = ar(8, RANK + 10)
queued_behind = (calls()[1] - before[1]) - 4   # the blocking call itself
behind_done = all(w.is_completed() for w in works)
behind_ok = bool((a == 21).all()) and all(bool((b == 1 + 2 * k).all()) for k, b in enumerate(bufs))

# 3. another thread submits while this one is inline: its work runs after the inline call
comm.barrier()
if RANK == 0:
    big, small = np.full(1 << 16, 1.0, np.float32), np.full(4, 2.0, np.float32)
    box = {}
    def submitter():
        time.sleep(0.2)                  # the main thread is inside its blocking call
        box["w"] = comm.all_reduce(small, async_op=True)
    t = threading.Thread(target=submitter)
    before = calls()
    t.start()
    comm.all_reduce(big)                 # rank 1 enters it only after 0.5 s
    t.join()
    box["w"].wait()
    cross_inline = calls()[0] - before[0]
else:
    big, small = np.full(1 << 16, 1.0, np.float32), np.full(4, 2.0, np.float32)
    time.sleep(0.5)
    comm.all_reduce(big)
    comm.all_reduce(small)
    cross_inline = 1
cross_ok = bool((big == 2).all()) and bool((small == 4).all())
comm.barrier()
comm.destroy()
result(inline_idle=inline_idle, idle_ok=idle_ok, queued_behind=queued_behind,
       behind_done=behind_done, behind_ok=behind_ok, cross_inline=cross_inline, cross_ok=cross_ok)
'''


def test_inline_and_queued_calls_keep_call_order():
    for rank, r in enumerate(harness.run(ORDER, 2, timeout=90)):
        assert r["inline_idle"] == 5, (rank, r)
        assert r["idle_ok"], (rank, r)
        if rank == 0:
            assert r["queued_behind"] == 1, r
            assert r["behind_done"], r
        assert r["behind_ok"], (rank, r)
        assert r["cross_inline"] == 1, (rank, r)
        assert r["cross_ok"], (rank, r)


CALLBACKS = r'''
comm = connect()
seen, raised = [], []
sys.unraisablehook = lambda u: raised.append(repr(u.exc_value))
if RANK == 1:
    time.sleep(0.3)
a = np.full(64, float(RANK), np.float32)
w = comm.all_reduce(a, async_op=True)
w.add_done_callback(lambda work: seen.append(("first", work is w, threading.current_thread() is threading.main_thread(), float(a[0]))))
w.add_done_callback(lambda work: 1 / 0)
def blocking_inside(work):
    try:
        comm.barrier()
        seen.append(("barrier", "returned"))
    except RuntimeError as e:
        seen.append(("barrier", str(e)))
if RANK == 0:                            # surely unfinished here: rank 1 is asleep
    w.add_done_callback(blocking_inside)
w.wait()
deadline = time.time() + 5
while len(seen) < 2 - RANK and time.time() < deadline:
    time.sleep(0.01)
w.add_done_callback(lambda work: seen.append(("late", threading.current_thread() is threading.main_thread())))
# a group's work takes callbacks before the group is submitted
with comm.group(async_op=True) as g:
    g.add_done_callback(lambda work: seen.append(("group", work is g)))
    comm.all_reduce(np.ones(4, np.float32))
g.wait()
deadline = time.time() + 5
while len(seen) < 4 - RANK and time.time() < deadline:
    time.sleep(0.01)
comm.barrier()
comm.destroy()
result(seen=seen, raised=raised)
'''


def test_done_callbacks():
    for rank, r in enumerate(harness.run(CALLBACKS, 2, timeout=60)):
        seen = {s[0]: s[1:] for s in r["seen"]}
        # ran once the result was in the buffer, on the submission thread (rank 0's work
        # was surely unfinished when the callback was added)
        assert seen["first"][0] and seen["first"][2] == 1.0, (rank, r)
        if rank == 0:
            assert seen["first"][1] is False, r
        if rank == 0:
            assert seen["barrier"][0].startswith("a blocking collective: called from a done callback"), r
        assert seen["late"] == [True], (rank, r)
        assert seen["group"] == [True], (rank, r)
        assert len(r["raised"]) == 1 and "ZeroDivisionError" in r["raised"][0], (rank, r)


TIMEOUT = r'''
comm = connect()
if RANK == 0:
    a = np.ones(1024, np.float32)
    start = time.perf_counter()
    try:
        if ARGS["async"]:
            comm.all_reduce(a, async_op=True, timeout=0.3).wait()
        else:
            comm.all_reduce(a, timeout=0.3)    # rank 1 never calls it
        result(raised=None)
    except chorus.Error as e:
        took = time.perf_counter() - start
        try:
            comm.barrier()
            after = None
        except chorus.Error as e2:
            after = type(e2).__name__
        result(raised=type(e).__name__, text=str(e), took=took, after=after)
else:
    time.sleep(2.0)                  # alive, but never enters the all-reduce
    try:
        comm.barrier(timeout=20)     # rank 0 has aborted and left by now
        result(raised=None)
    except chorus.Error as e:
        result(raised=type(e).__name__)
'''


@pytest.mark.parametrize("mode", ["blocking", "async"])
def test_call_timeout_raises_timeout_and_aborts(mode):
    r0, r1 = harness.run(TIMEOUT, 2, timeout=60, args={"async": mode == "async"})
    assert r0["raised"] == "Timeout", r0
    assert r0["text"].startswith("[chorus:timeout] all-reduce"), r0
    assert "the call's timeout" in r0["text"], r0
    assert 0.3 <= r0["took"] < 5, r0
    assert r0["after"] in ("Aborted", "Destroyed"), r0
    assert r1["raised"] in ("PeerDeparted", "PeerFailed"), r1


DROPPED = r'''
import gc, weakref
comm = connect()
if RANK == 1:
    time.sleep(0.5)                      # rank 0's operation is unfinished when it drops it
a = np.full(1 << 18, float(RANK + 1), np.float32)
ref = weakref.ref(a)
w = comm.all_reduce(a, async_op=True)
unfinished = not w.is_completed()
del w, a
gc.collect()
held = ref() is not None                 # the operation keeps its buffer alive
b = np.full(8, float(RANK), np.float32)
comm.all_reduce(b)                       # queued behind the dropped operation
comm.barrier()
gc.collect()
result(unfinished=unfinished, held=held, freed=ref() is None, later_ok=bool((b == 1).all()))
comm.destroy()
'''


def test_dropping_an_unfinished_work_is_harmless():
    r0, r1 = harness.run(DROPPED, 2, timeout=60)
    assert r0["unfinished"] and r0["held"], r0
    for r in (r0, r1):
        assert r["later_ok"], r
        assert r["freed"], f"the buffer of a finished operation was not released: {r}"


STEAL = r'''
comm = connect(op_timeout="60s")
def stolen():
    return comm._c._stolen()

# 1. submit, then wait at once: the waiter may run the op itself (when the submission
#    thread has not started it), and the results are the same either way
before = stolen()
ok = True
for k in range(200):
    a = np.full(8, float(RANK + k), np.float32)
    comm.all_reduce(a, async_op=True).wait()
    ok = ok and bool((a == 2 * k + 1).all())
took = stolen() - before

# 2. a wait shorter than the op timeout never runs the op on the waiter's thread
before = stolen()
for k in range(50):
    a = np.full(8, float(RANK), np.float32)
    assert comm.all_reduce(a, async_op=True).wait(5.0)
    ok = ok and bool((a == 1).all())
short_took = stolen() - before

# 3. waiting on the last of several unfinished works: earlier ones end first, in order
if RANK == 1:
    time.sleep(0.3)
bufs = [np.full(100 + k, float(RANK + k), np.float32) for k in range(3)]
works = [comm.all_reduce(b, async_op=True) for b in bufs]
works[-1].wait()
earlier_done = all(w.is_completed() for w in works[:-1])
order_ok = all(bool((b == 1 + 2 * k).all()) for k, b in enumerate(bufs))
comm.barrier()
comm.destroy()
result(ok=ok, took=took, short_took=short_took, earlier_done=earlier_done, order_ok=order_ok)
'''


def test_a_waiter_runs_its_queued_op_itself_only_when_it_is_next():
    for rank, r in enumerate(harness.run(STEAL, 2, timeout=90)):
        assert r["ok"], (rank, r)
        # the submission thread may win the race now and then, not every time
        assert r["took"] >= 1, (rank, r)
        assert r["short_took"] == 0, (rank, r)
        assert r["earlier_done"] and r["order_ok"], (rank, r)
