# A training loop that survives a rank's death: chorus run -n 4 -- python python/examples/torch_fault_tolerant.py
# (rank 3 kills itself at step 5; the others get chorus.PeerFailed, shrink to 3 ranks and finish)
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn

import chorus.torch

dist.init_process_group("chorus")
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
ddp = nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
step = 0
while step < 20:
    rank, world = dist.get_rank(), dist.get_world_size()
    if step == 5 and world == 4 and rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # a rank dies mid-training
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * world + rank))
    try:
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        step += 1
    except RuntimeError:  # DDP's backward re-raises chorus.PeerFailed as a RuntimeError
        e = dist.group.WORLD.errored()  # the typed error: PeerFailed naming the rank
        print(f"rank {rank}: step {step}: {type(e).__name__}: peer {e.peer}")
        pg = chorus.torch.shrink()  # survivors, renumbered 0..2 in their old order
        ddp = nn.parallel.DistributedDataParallel(net, process_group=pg)  # retry this step
if dist.get_rank() == 0:
    print(f"finished {step} steps on {dist.get_world_size()} ranks")
dist.destroy_process_group()
