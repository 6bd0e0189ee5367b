"""Runs one script as N real processes on loopback, each a rank of a fresh communicator,
under one deadline: a rank that hangs is killed and the test fails with every rank's
stderr. Each rank prints its findings as one ``RESULT <json>`` line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Dict, List, Optional

import chorus

PRELUDE = '''
import json, os, sys, time, threading, signal
import numpy as np
import chorus
RANK = int(os.environ["T_RANK"])
WORLD = int(os.environ["T_WORLD"])
ARGS = json.loads(os.environ["T_ARGS"])
CONFIG = json.loads(os.environ["T_CONFIG"])

def connect(**extra):
    cfg = dict(CONFIG)
    cfg.update(extra)
    return chorus.Comm(os.environ["T_TOKEN"], RANK, WORLD, **cfg)

def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)

def mark(what):
    print("MARK " + what + " " + repr(time.time()), flush=True)
'''

# Short deadlines: the suite runs on a loaded machine, but nothing should wait long.
CONFIG = {"init_timeout": "30s", "teardown_budget": "2s"}


class Ranks:
    """The processes of one run. A thread per stream collects each rank's output as it
    comes, so a MARK can be awaited and nothing a rank prints is lost."""

    def __init__(self, procs: List[subprocess.Popen], deadline: float) -> None:
        self.procs = procs
        self.deadline = deadline
        self.out: List[List[str]] = [[] for _ in procs]
        self.err: List[List[str]] = [[] for _ in procs]
        self.uid: Any = None
        self.readers = []
        for rank, p in enumerate(procs):
            for stream, sink in ((p.stdout, self.out[rank]), (p.stderr, self.err[rank])):
                t = threading.Thread(target=_collect, args=(stream, sink), daemon=True)
                t.start()
                self.readers.append(t)

    def wait_mark(self, rank: int, what: str) -> float:
        """Waits until rank prints ``MARK what``; returns its time."""
        prefix = f"MARK {what} "
        while time.time() < self.deadline:
            for line in list(self.out[rank]):
                if line.startswith(prefix):
                    return float(line.split()[-1])
            if self.procs[rank].poll() is not None and not any(t.is_alive() for t in self.readers):
                break
            time.sleep(0.002)
        self.kill()
        raise AssertionError(f"rank {rank} never reached {what!r}:\n{self.stderr()}")

    def finish(self, expect_rc: Optional[Dict[int, int]] = None) -> List[Optional[dict]]:
        """Waits for every rank (killing all at the deadline); the RESULT of each (None
        for a rank that printed none, e.g. one that was killed)."""
        for rank, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(0.1, self.deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"rank {rank} still running at the deadline:\n{self.stderr()}")
        for t in self.readers:
            t.join(timeout=5)
        results: List[Optional[dict]] = []
        for rank, p in enumerate(self.procs):
            want = (expect_rc or {}).get(rank, 0)
            if want is not None and p.returncode != want:
                raise AssertionError(
                    f"rank {rank} exited {p.returncode}, expected {want}:\n{self.stderr()}"
                )
            lines = [line for line in self.out[rank] if line.startswith("RESULT ")]
            results.append(json.loads(lines[-1][len("RESULT "):]) if lines else None)
        return results

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def stderr(self) -> str:
        return "\n".join(
            f"--- rank {rank} stdout:\n{''.join(self.out[rank])[-3000:]}\n"
            f"--- stderr:\n{''.join(self.err[rank])[-3000:]}"
            for rank in range(len(self.procs))
        )


def _collect(stream: Any, sink: List[str]) -> None:
    for line in iter(stream.readline, ""):
        sink.append(line)
    stream.close()


def start(body: str, world: int, *, timeout: float = 60.0, args: Any = None,
          config: Optional[dict] = None, env: Optional[dict] = None) -> Ranks:
    """Starts ``body`` (after PRELUDE) as ``world`` ranks of a fresh communicator, whose
    bootstrap root runs in this (the pytest) process."""
    cfg = dict(CONFIG)
    cfg.update(config or {})
    uid = chorus.UniqueId.new(world, **{k: v for k, v in cfg.items() if k == "init_timeout"})
    script = PRELUDE + textwrap.dedent(body)
    procs = []
    for rank in range(world):
        e = dict(os.environ)
        e.update(env or {})
        e.update(
            T_TOKEN=str(uid),
            T_RANK=str(rank),
            T_WORLD=str(world),
            T_ARGS=json.dumps(args),
            T_CONFIG=json.dumps(cfg),
            PYTHONUNBUFFERED="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    ranks = Ranks(procs, time.time() + timeout)
    ranks.uid = uid  # keeps the bootstrap root alive for the run
    return ranks


def run(body: str, world: int, **kw: Any) -> List[Optional[dict]]:
    """``start`` then ``finish``: every rank must exit 0."""
    return start(body, world, **kw).finish()
