"""chorus.torch: the init methods (tcp://, file://, env://), torchft's watchdog abort,
timeouts, bad input and grow (a third process joins), on plain processes; and the README's
DDP example under `chorus run`."""

import json
import os
import subprocess
import sys

import pytest

from torch_jobs.launch import JOBS, REPO, free_port, job_env, kill_session, require_torch, run

require_torch(__name__)


@pytest.mark.timeout(300)
def test_init_methods_abort_timeouts_bad_input(tmp_path):
    port = free_port()
    store = tmp_path / "store"
    env = job_env(tmp_path)
    procs = [
        subprocess.Popen([sys.executable, str(JOBS / "misc.py"), str(r), str(port), str(store)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for r in ("0", "1", "join")
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=150)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                kill_session(q)
            pytest.fail("misc.py did not finish within 150 s")
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-5000:] for o in outs)
    found = json.loads((tmp_path / "misc.json").read_text())
    assert found["abort_release_s"] < 0.05
    print(f"misc: {found}", file=sys.stderr)


@pytest.mark.timeout(300)
def test_under_chorus_run(tmp_path):
    chorus = os.environ.get("CHORUS_BIN") or str(REPO / "target" / "debug" / "chorus")
    if not os.path.exists(chorus):
        print(f"{__name__}: skipped test_under_chorus_run: {chorus} is not built (cargo build -p chorus-cli)", file=sys.stderr)
        pytest.skip("chorus-cli is not built")
    cmd = [chorus, "run", "-n", "2", "--", sys.executable, str(REPO / "python" / "examples" / "torch_ddp.py")]
    out = run(cmd, job_env(tmp_path), timeout=120).stdout
    assert "final loss" in out, out


@pytest.mark.timeout(400)
def test_fault_tolerant_example_under_chorus_run(tmp_path):
    chorus = os.environ.get("CHORUS_BIN") or str(REPO / "target" / "debug" / "chorus")
    if not os.path.exists(chorus):
        print(f"{__name__}: skipped the fault-tolerant example: {chorus} is not built (cargo build -p chorus-cli)", file=sys.stderr)
        pytest.skip("chorus-cli is not built")
    cmd = [chorus, "run", "-n", "4", "--", sys.executable, str(REPO / "python" / "examples" / "torch_fault_tolerant.py")]
    out = run(cmd, job_env(tmp_path), timeout=300, expect_ok=False).stdout
    # Rank 3 killed itself (so `chorus run` reports a failed rank); the others went on.
    for r in range(3):
        assert f"rank {r}: step 5: PeerFailed: peer 3" in out, out
    assert "finished 20 steps on 3 ranks" in out, out
    assert "rank 3" in out and "SIGKILL" in out, out
