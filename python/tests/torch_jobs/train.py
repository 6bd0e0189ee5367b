"""Training jobs for the chorus.torch tests, run under torchrun.

    train.py ddp STEPS                  DDP on gloo, then on chorus, then FSDP2 on chorus;
                                        rank 0 saves the losses and parameters of each
    train.py fsdp STEPS                 FSDP2 fully_shard on chorus only
    train.py fault kill|stop VICTIM AT STEPS
                                        hand-written data parallelism on chorus; VICTIM
                                        kills (or stops) itself at step AT while the others
                                        wait on the gradients; they record what they saw,
                                        and after a kill shrink and finish the run
    train.py resume CKPT AT STEPS       the same loop from a checkpoint at step AT

The model and every rank's batch at every step are fixed by seeds, so runs with the same
world size see the same data whatever the backend.
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import chorus
import chorus.torch

OUT = os.environ["OUT"]
LR = 0.1


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(8, 8, generator=g)
    return x, x[:, :4].sum(dim=1, keepdim=True) - 0.5 * x[:, 4:].sum(dim=1, keepdim=True)


def save(name: str, m: nn.Module, losses, **extra) -> None:
    state = {k: v.detach().clone() for k, v in m.state_dict().items()}
    torch.save({"params": state, "losses": losses, **extra}, os.path.join(OUT, name))


def ddp(steps: int) -> None:
    dist.init_process_group("chorus")
    gloo = dist.new_group(backend="gloo")
    for backend, group in (("gloo", gloo), ("chorus", None)):
        ddp_run(backend, group, steps)
    fsdp_run(steps)
    dist.destroy_process_group()


def ddp_run(backend: str, group, steps: int) -> None:
    rank = dist.get_rank()
    net = nn.parallel.DistributedDataParallel(model(), process_group=group)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    losses, times = [], []
    for step in range(steps):
        x, y = batch(step, rank)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        # The loss curve: every rank's loss, averaged (the same reduction on both backends).
        avg = loss.detach().clone()
        dist.all_reduce(avg, group=group)
        losses.append(avg.item() / dist.get_world_size())
    if rank == 0:
        save(f"ddp-{backend}.pt", net.module, losses, step_seconds=sorted(times[2:])[len(times[2:]) // 2])


def fsdp(steps: int) -> None:
    dist.init_process_group("chorus")
    fsdp_run(steps)
    dist.destroy_process_group()


def fsdp_run(steps: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    net = model()
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        losses.append(avg.item() / dist.get_world_size())
    full = {k: v.full_tensor() for k, v in net.state_dict().items()}
    if rank == 0:
        torch.save({"params": full, "losses": losses}, os.path.join(OUT, f"fsdp-{dist.get_world_size()}.pt"))


def train_steps(net: nn.Module, group, start: int, steps: int, victim=None, how=None, at=None):
    """Hand-written data parallelism: gradients summed with async all-reduces."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    for step in range(start, steps):
        x, y = batch(step, rank)
        net.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        works = [dist.all_reduce(p.grad, group=group, async_op=True) for p in net.parameters()]
        if victim is not None and step == at and rank == victim:
            with open(os.path.join(OUT, "victim-pid.json.tmp"), "w") as f:
                json.dump({"pid": os.getpid()}, f)  # the test watches this process's end
            os.rename(os.path.join(OUT, "victim-pid.json.tmp"), os.path.join(OUT, "victim-pid.json"))
            time.sleep(0.5)  # the others are in wait() by now
            with open(os.path.join(OUT, "victim.json"), "w") as f:
                json.dump({"t": time.time(), "how": how}, f)
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            time.sleep(60)
        for w in works:
            w.wait()
        with torch.no_grad():
            for p in net.parameters():
                p -= LR * p.grad / n
    return net


def fault(how: str, victim: int, at: int, steps: int) -> None:
    dist.init_process_group("chorus", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    net = model()
    try:
        train_steps(net, None, 0, steps, victim, how, at)
        raise AssertionError("training went on past the victim's failure")
    except chorus.Error as e:
        seen = {"t": time.time(), "class": type(e).__name__, "peer": e.peer, "message": str(e)}
        seen["errored"] = type(dist.group.WORLD.errored()).__name__
    with open(os.path.join(OUT, f"seen-{rank}.json.tmp"), "w") as f:
        json.dump(seen, f)
    os.rename(os.path.join(OUT, f"seen-{rank}.json.tmp"), os.path.join(OUT, f"seen-{rank}.json"))
    if how == "stop":
        # Leave only once every survivor has recorded what it saw: an abort here departs
        # this rank, and a survivor whose own deadline for the frozen rank has not fired
        # yet would fail on that departure instead (a race of the test, not of chorus).
        others = [r for r in range(dist.get_world_size()) if r not in (rank, victim)]
        until = time.time() + 30
        while time.time() < until and not all(
            os.path.exists(os.path.join(OUT, f"seen-{r}.json")) for r in others
        ):
            time.sleep(0.01)
        dist.group.WORLD.abort()
        os._exit(0)
    group = chorus.torch.shrink()
    assert group is dist.distributed_c10d._get_default_group()
    new_rank = dist.get_rank()
    if new_rank == 0:
        save("checkpoint.pt", net, [], at=at, world=dist.get_world_size(), old_rank=rank)
    train_steps(net, group, at, steps)
    dist.barrier()
    dist.destroy_process_group()
    if new_rank == 0:
        save("shrunk.pt.tmp", net, [], world=3)
        os.rename(os.path.join(OUT, "shrunk.pt.tmp"), os.path.join(OUT, "shrunk.pt"))


def resume(ckpt: str, at: int, steps: int) -> None:
    dist.init_process_group("chorus")
    net = model()
    net.load_state_dict(torch.load(ckpt)["params"])
    train_steps(net, None, at, steps)
    if dist.get_rank() == 0:
        save("resumed.pt", net, [], world=dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "ddp":
        ddp(int(args[0]))
    elif mode == "fsdp":
        fsdp(int(args[0]))
    elif mode == "fault":
        fault(args[0], int(args[1]), int(args[2]), int(args[3]))
    elif mode == "resume":
        resume(args[0], int(args[1]), int(args[2]))
    else:
        raise SystemExit(f"unknown mode {mode}")
