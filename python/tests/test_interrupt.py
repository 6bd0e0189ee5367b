"""Seed 001's watchdog, done right: a collective blocked on a rank that never calls it is
released by another thread's ``abort()`` within 50 ms, raising ``Aborted``; Ctrl-C
(SIGINT) releases it within 100 ms, raising ``KeyboardInterrupt``, and leaves the
communicator aborted."""

import signal
import time

import harness

WATCHDOG = r'''
comm = connect()
if RANK == 0:
    a = np.ones(1024, np.float32)
    fired = {}
    def watchdog():
        time.sleep(0.5)
        fired["at"] = time.perf_counter()
        comm.abort("refit watchdog: deadline passed")
    threading.Thread(target=watchdog, daemon=True).start()
    try:
        comm.all_reduce(a)          # rank 1 never calls it
        result(raised=None)
    except chorus.Error as e:
        released = time.perf_counter() - fired["at"]
        result(raised=type(e).__name__, text=str(e), released_ms=released * 1000)
else:
    time.sleep(2.0)                 # alive, but never enters the collective
    result(raised=None)
'''


def test_watchdog_abort_releases_a_blocked_collective():
    r0, _ = harness.run(WATCHDOG, 2, timeout=60)
    assert r0["raised"] == "Aborted", r0
    assert r0["text"].startswith("[chorus:aborted]") and "refit watchdog" in r0["text"]
    assert r0["released_ms"] < 50, r0


SIGINT = r'''
comm = connect()
if RANK == 0:
    a = np.ones(1024, np.float32)
    mark("blocked")
    try:
        comm.all_reduce(a)
        result(raised=None)
    except KeyboardInterrupt:
        caught = time.time()
        try:
            comm.barrier()
            after = None
        except chorus.Error as e:
            after = type(e).__name__
        result(raised="KeyboardInterrupt", caught=caught, after=after)
else:
    time.sleep(3.0)
    result(raised=None)
'''


def test_sigint_raises_keyboard_interrupt_within_100ms():
    ranks = harness.start(SIGINT, 2, timeout=60)
    ranks.wait_mark(0, "blocked")
    time.sleep(0.3)  # well inside the all-reduce
    sent = time.time()
    ranks.procs[0].send_signal(signal.SIGINT)
    r0, _ = ranks.finish()
    assert r0["raised"] == "KeyboardInterrupt", r0
    assert (r0["caught"] - sent) * 1000 < 100, r0
    # the interrupt aborted the communicator: later calls are refused
    assert r0["after"] == "Destroyed", r0
