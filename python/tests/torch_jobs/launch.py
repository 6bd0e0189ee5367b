"""Starting the torch jobs of the chorus.torch tests as real processes, every wait bounded.

``torchrun`` here is ``python -m torch.distributed.run`` with this interpreter. A launch
that outlives its limit is killed (its whole process group) and fails the test with the
output it had.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

JOBS = Path(__file__).resolve().parent
REPO = JOBS.parents[2]


def require_torch(module: str) -> None:
    """Skips ``module`` (with one line on stderr) when torch or the backend is missing."""
    try:
        import torch  # noqa: F401
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            raise ImportError("torch.distributed with gloo is not available")
        import chorus.torch  # noqa: F401
    except ImportError as e:
        print(f"{module}: skipped: torch is not usable here ({e})", file=sys.stderr)
        pytest.skip(f"torch is not usable here ({e})", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(out: Path, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env["OUT"] = str(out)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    env.setdefault("PYTHONWARNINGS", "ignore")
    if extra:
        env.update(extra)
    return env


def torchrun_args(nproc: int, rdzv: str = "standalone") -> List[str]:
    args = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if rdzv == "standalone":
        args.append("--standalone")
    elif rdzv == "c10d":
        args += ["--nnodes=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    elif rdzv == "static":
        args += ["--nnodes=1", "--node-rank=0", "--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    else:
        raise ValueError(rdzv)
    return args


def run(cmd: Sequence[str], env: Dict[str, str], timeout: float, expect_ok: bool = True) -> subprocess.CompletedProcess:
    """Runs ``cmd`` in its own session; kills the whole session at ``timeout``."""
    p = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=str(REPO))
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(p)
        out, _ = p.communicate(timeout=10)
        pytest.fail(f"{' '.join(cmd[-3:])} did not finish within {timeout:g} s:\n{out[-6000:]}")
    if expect_ok and p.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {p.returncode}:\n{excerpt(out)}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, "")


def torchrun(script: str, nproc: int, out: Path, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None, rdzv: str = "standalone", timeout: float = 120) -> str:
    cmd = torchrun_args(nproc, rdzv) + [str(JOBS / script), *args]
    return run(cmd, job_env(out, env), timeout).stdout


def excerpt(out: str) -> str:
    """The first traceback of a failed launch, and its end."""
    first = out.find("Traceback")
    head = out[first : first + 5000] if first >= 0 else ""
    return f"{head}\n...\n{out[-3000:]}"


def kill_session(p: subprocess.Popen) -> None:
    """SIGKILLs ``p``'s process group and every process below ``p``, whatever their
    session: torchrun's agent starts each worker in a session of its own, so killing the
    agent's group alone left a worker the test had frozen (SIGSTOP) stopped for ever,
    reparented to init."""
    for pid in [p.pid, *descendants(p.pid)]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # gone already, or not a group leader


def descendants(pid: int) -> List[int]:
    """Every live process below ``pid`` (its children, theirs, ...), read from /proc."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        # The command name may hold spaces and parentheses: the fields follow the last ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def gone(pid: int, within: float) -> bool:
    """Whether ``pid`` has ended (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


class ExitWatch:
    """When a process ends, as the kernel tells it (a pidfd turns readable once the process
    has finished exiting: its memory unmapped, its sockets closed). Started on the pid a job
    writes to ``pid_file``; ``gone`` is the wall-clock time of the end, or None.

    ``exiting`` is when the kernel began tearing it down (PF_EXITING in /proc/PID/stat,
    polled every 2 ms): what a same-host observer could see before ``gone``."""

    def __init__(self, pid_file: Path, timeout: float) -> None:
        import json
        import select
        import threading

        self.gone: Optional[float] = None
        self.exiting: Optional[float] = None
        self._stop = threading.Event()

        def exiting(pid: int) -> None:
            while self.exiting is None and not self._stop.is_set():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        flags = int(f.read().rsplit(")", 1)[1].split()[6])
                except (OSError, ValueError, IndexError):
                    return
                if flags & 0x4:  # PF_EXITING
                    self.exiting = time.time()
                time.sleep(0.002)

        def watch() -> None:
            deadline = time.monotonic() + timeout
            fd = None
            while fd is None and time.monotonic() < deadline:
                try:
                    fd = os.pidfd_open(json.loads(pid_file.read_text())["pid"])
                except (OSError, ValueError, KeyError):  # not written yet
                    time.sleep(0.01)
            if fd is None:
                return
            pid = json.loads(pid_file.read_text())["pid"]
            threading.Thread(target=exiting, args=(pid,), daemon=True).start()
            try:
                ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
                if ready:
                    self.gone = time.time()
            finally:
                self._stop.set()
                os.close(fd)

        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> Optional[float]:
        self.thread.join(timeout)
        return self.gone


class Nodes:
    """``nnodes`` torchrun agents with one worker each, on one host, meeting by static
    rendezvous: the shape of a multi-node job, where one node's death does not bring down
    the others' agents (a single agent stops all its workers when one fails)."""

    def __init__(self, script: str, nnodes: int, out: Path, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None) -> None:
        port = free_port()
        self.procs = []
        for node in range(nnodes):
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1",
                f"--nnodes={nnodes}", f"--node-rank={node}", "--master-addr=127.0.0.1",
                f"--master-port={port}", str(JOBS / script), *args,
            ]
            log = open(out / f"node{node}.log", "w")
            self.procs.append(subprocess.Popen(cmd, env=job_env(out, env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=str(REPO)))
        self.out = out

    def wait(self, nodes: Sequence[int], timeout: float) -> List[int]:
        """Exit codes of ``nodes``; fails the test with their logs if any is still running
        at ``timeout``."""
        deadline = time.monotonic() + timeout
        codes = []
        for i in nodes:
            try:
                codes.append(self.procs[i].wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"node {i} did not finish within {timeout:g} s:\n{self.logs()}")
        return codes

    def wait_files(self, paths: Sequence[Path], timeout: float) -> None:
        """Waits until every path exists (each worker writes one when it is done). The
        agents are not waited for: after a node's death, torchrun's exit barrier holds the
        others for its own timeout."""
        deadline = time.monotonic() + timeout
        while not all(p.exists() for p in paths):
            if time.monotonic() > deadline:
                self.kill()
                missing = [p.name for p in paths if not p.exists()]
                pytest.fail(f"{missing} not written within {timeout:g} s:\n{self.logs()}")
            time.sleep(0.05)

    def kill(self) -> None:
        for p in self.procs:
            kill_session(p)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def logs(self) -> str:
        return "\n".join(f"--- node {i} ---\n{(self.out / f'node{i}.log').read_text()[-4000:]}" for i in range(len(self.procs)))
