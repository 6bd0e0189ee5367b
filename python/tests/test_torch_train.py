"""chorus.torch training: DDP on 4 ranks against gloo with the same seeds, and FSDP2's
fully_shard on 2 and 4 ranks against one process training on the whole batch."""

import sys

import pytest

from torch_jobs.launch import JOBS, require_torch, torchrun

require_torch(__name__)

import torch  # noqa: E402

STEPS = 12


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """One 4-rank launch: DDP on gloo, DDP on chorus, FSDP2 on chorus, same seeds."""
    out = tmp_path_factory.mktemp("train4")
    torchrun("train.py", 4, out, ["ddp", str(STEPS)], timeout=240)
    return out


@pytest.mark.timeout(300)
def test_ddp_matches_gloo(four):
    gloo = torch.load(four / "ddp-gloo.pt")
    ours = torch.load(four / "ddp-chorus.pt")
    for name, p in gloo["params"].items():
        q = ours["params"][name]
        rel = ((q - p).abs().max() / p.abs().max().clamp_min(1e-12)).item()
        assert rel < 1e-5, f"{name}: relative difference {rel}"
    assert [f"{x:.4g}" for x in ours["losses"]] == [f"{x:.4g}" for x in gloo["losses"]]
    assert ours["losses"][-1] < ours["losses"][0]  # it trained
    print(
        f"DDP step (median, 4 ranks): gloo {gloo['step_seconds'] * 1e3:.2f} ms, "
        f"chorus {ours['step_seconds'] * 1e3:.2f} ms",
        file=sys.stderr,
    )


def reference(world: int, steps: int):
    """One process, the whole batch of every rank each step: what FSDP must compute."""
    sys.path.insert(0, str(JOBS))
    import os

    os.environ.setdefault("OUT", "")
    import importlib

    train = importlib.import_module("train")
    net = train.model()
    opt = torch.optim.SGD(net.parameters(), lr=train.LR)
    losses = []
    for step in range(steps):
        xs, ys = zip(*(train.batch(step, r) for r in range(world)))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(torch.cat(xs)), torch.cat(ys))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return net.state_dict(), losses


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_matches_one_process(tmp_path, four, world):
    if world == 4:
        out = four
    else:
        torchrun("train.py", world, tmp_path, ["fsdp", str(STEPS)], timeout=150)
        out = tmp_path
    got = torch.load(out / f"fsdp-{world}.pt")
    params, losses = reference(world, STEPS)
    for name, p in params.items():
        torch.testing.assert_close(got["params"][name], p, rtol=1e-5, atol=1e-6)
    assert [f"{x:.4g}" for x in got["losses"]] == [f"{x:.4g}" for x in losses]
