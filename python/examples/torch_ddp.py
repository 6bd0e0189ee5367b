# DDP on chorus: torchrun --nproc-per-node 4 python/examples/torch_ddp.py
import torch
import torch.distributed as dist
import torch.nn as nn

import chorus.torch  # noqa: F401  registers the "chorus" backend

dist.init_process_group("chorus")  # was: "gloo"
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(50):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * world + rank))
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()  # gradients all-reduced by chorus
    opt.step()
if rank == 0:
    print(f"final loss {loss.item():.4f} on {world} ranks")
dist.destroy_process_group()
