"""chorus.torch under failures, as torchrun runs a multi-node job (one agent per node, so
one node's death leaves the others running): a SIGKILLed rank is a PeerFailed naming it
within 100 ms on every survivor, who shrink and finish the training exactly as a 3-rank
run from the same checkpoint does; a SIGSTOPped rank within the heartbeat deadline + 20 %."""

import json

import pytest

from torch_jobs.launch import Nodes, require_torch, torchrun

require_torch(__name__)

import torch  # noqa: E402

AT, STEPS = 3, 8


def seen(out, ranks):
    return [json.loads((out / f"seen-{r}.json").read_text()) for r in ranks]


@pytest.mark.timeout(400)
def test_sigkill_names_the_rank_and_shrink_finishes_the_run(tmp_path):
    nodes = Nodes("train.py", 4, tmp_path, ["fault", "kill", "3", str(AT), str(STEPS)])
    try:
        codes = nodes.wait([0, 1, 2], timeout=150)
        assert codes == [0, 0, 0], nodes.logs()
        nodes.wait([3], timeout=30)
    finally:
        nodes.kill()
    victim = json.loads((tmp_path / "victim.json").read_text())
    for r, s in enumerate(seen(tmp_path, [0, 1, 2])):
        assert s["class"] == "PeerFailed" and s["peer"] == 3, (r, s)
        assert s["errored"] == "PeerFailed", (r, s)
        assert s["t"] - victim["t"] < 0.1, f"rank {r} learned of the kill after {s['t'] - victim['t']:.3f} s"
    ckpt = torch.load(tmp_path / "checkpoint.pt")
    assert ckpt["world"] == 3 and ckpt["at"] == AT
    torchrun("train.py", 3, tmp_path, ["resume", str(tmp_path / "checkpoint.pt"), str(AT), str(STEPS)], timeout=120)
    shrunk = torch.load(tmp_path / "shrunk.pt")["params"]
    resumed = torch.load(tmp_path / "resumed.pt")["params"]
    for name, p in resumed.items():
        assert torch.equal(shrunk[name], p), name


@pytest.mark.timeout(400)
def test_sigstop_is_peer_failed_within_the_deadline(tmp_path):
    deadline = 1.0
    env = {"CHORUS_HEARTBEAT_DEADLINE": f"{int(deadline * 1000)}ms", "CHORUS_HEARTBEAT_INTERVAL": "100ms"}
    nodes = Nodes("train.py", 3, tmp_path, ["fault", "stop", "2", str(AT), str(STEPS)], env=env)
    try:
        codes = nodes.wait([0, 1], timeout=150)
        assert codes == [0, 0], nodes.logs()
    finally:
        nodes.kill()  # the stopped rank and its agent
    victim = json.loads((tmp_path / "victim.json").read_text())
    for r, s in enumerate(seen(tmp_path, [0, 1])):
        assert s["class"] == "PeerFailed" and s["peer"] == 2, (r, s)
        assert s["t"] - victim["t"] <= deadline * 1.2, f"rank {r}: {s['t'] - victim['t']:.3f} s"
