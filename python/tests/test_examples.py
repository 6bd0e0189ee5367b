"""The README's examples, run as a new user would, under `chorus run` (which is also
`Comm.from_env()`'s test)."""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
CHORUS = os.environ.get("CHORUS_BIN") or str(HERE.parents[1] / "target" / "debug" / "chorus")


def chorus_run(n, example, timeout=120):
    if not os.access(CHORUS, os.X_OK):
        pytest.fail(f"no chorus binary at {CHORUS}: build it with `cargo build -p chorus-cli`")
    return subprocess.run(
        [CHORUS, "run", "-q", "-n", str(n), "--", sys.executable, str(EXAMPLES / example)],
        capture_output=True, text=True, timeout=timeout,
    )


def test_all_reduce_under_chorus_run():
    p = chorus_run(4, "all_reduce.py")
    assert p.returncode == 0, p.stdout + p.stderr
    for rank in range(4):
        assert f"rank {rank} of 4: [10.0, 10.0, 10.0, 10.0]" in p.stdout, p.stdout + p.stderr


def test_refit_example_shrinks_and_refits():
    p = chorus_run(5, "refit.py")
    # rank 2 killed itself on purpose: chorus run reports a failed rank
    assert p.returncode == 1, p.stdout + p.stderr
    for new_rank in range(4):
        assert f"rank {new_rank} of 4 after shrink: identical=True" in p.stdout, p.stdout + p.stderr
    assert p.stdout.count("[chorus:peer-failed]") == 4, p.stdout


def test_asyncio_example():
    p = chorus_run(2, "asyncio_all_reduce.py")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0: [1.0, 3.0, 5.0, 7.0]" in p.stdout, p.stdout + p.stderr
