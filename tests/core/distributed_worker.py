"""One rank of test_distributed.py: trains a small model of torch.nn modules, eager and
kernelized, under DDP or FSDP2 (gloo on the CPU, NCCL on one GPU per rank; loopback
rendezvous), and prints both loss trajectories.

Run as `python distributed_worker.py ENGINE DEVICE RANK WORLD PORT` (DEVICE: cpu or cuda);
every rank must be started.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import tileops.nn as tnn

STEPS = 4
TIMEOUT = timedelta(seconds=90)  # a rank that never comes fails the others, never hangs them
DEVICE = torch.device("cpu")


def model() -> nn.Sequential:
    torch.manual_seed(0)  # every rank, and both variants, start from the same weights
    return nn.Sequential(
        nn.Linear(12, 32),
        nn.LayerNorm(32),
        nn.ReLU(inplace=True),
        nn.Linear(32, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(inplace=True),
        nn.RMSNorm(32),
        nn.Linear(32, 5),
        nn.Softmax(dim=-1),
    )


def wrapped(module: nn.Module, engine: str) -> nn.Module:
    if engine == "ddp":
        return nn.parallel.DistributedDataParallel(module)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DEVICE.type, (dist.get_world_size(),))
    for layer in module:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def train(module: nn.Module, engine: str, rank: int) -> list[float]:
    """Losses of STEPS SGD steps on this rank's half of a fixed global batch, averaged over
    the ranks."""
    net = wrapped(module.to(DEVICE), engine)
    optim = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 12, generator=generator).to(DEVICE)
    labels = torch.randint(0, 5, (16,), generator=generator).to(DEVICE)
    mine = slice(rank * 8, rank * 8 + 8)
    losses = []
    for _ in range(STEPS):
        optim.zero_grad()
        loss = F.nll_loss(net(x[mine]).log(), labels[mine])
        loss.backward()
        optim.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses


def main() -> None:
    global DEVICE
    engine, device, rank, world, port = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    DEVICE = torch.device("cpu") if device == "cpu" else torch.device("cuda", rank)
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(
        "gloo" if DEVICE.type == "cpu" else "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=TIMEOUT,
    )
    try:
        eager = model()
        ours = copy.deepcopy(eager)
        swapped = len(tnn.kernelize(ours).swapped)
        result = {
            "swapped": swapped,
            "eager": train(eager, engine, rank),
            "kernelized": train(ours, engine, rank),
        }
        print(json.dumps(result))
    finally:
        dist.destroy_process_group()
    # Done and reported: leave without the interpreter's teardown, where torch's and gloo's
    # C++ threads can still abort a finished process ("terminate called without an active
    # exception", seen once under a loaded CI host with FSDP2).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
