"""Rank and world size from the environment (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK)."""

from __future__ import annotations

import os
from typing import Callable
from falcon_cli.errors import FalconError


def rank() -> int:
    """Global rank of this process (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Number of processes in the job (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0, the only rank that draws progress bars and writes artifacts."""
    return rank() == 0


def local_rank() -> int:
    """Rank of this process on its node (selects the CUDA device)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def init_distributed(device_type: str) -> bool:
    """Join the process group torchrun set up (NCCL on CUDA, gloo on CPU); False when single-process."""
    import torch
    import torch.distributed as dist

    if world_size() <= 1:
        return False
    if not dist.is_initialized():
        if device_type == "cuda":
            if local_rank() >= torch.cuda.device_count():
                # NCCL needs one GPU per process; two ranks on one GPU would fail deep inside NCCL.

                raise FalconError(f"torchrun started local rank {local_rank()} but this node has "
                                 f"{torch.cuda.device_count()} CUDA device(s); use --nproc_per_node "
                                 f"<= {torch.cuda.device_count()}, or set the stage's device=cpu (e.g. pretrain.device=cpu) for gloo processes")
            torch.cuda.set_device(local_rank())
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return True


def barrier() -> None:
    """Wait for every rank (no-op when single-process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def on_rank_zero(work: Callable[[], dict]) -> dict:
    """Run ``work()`` on rank 0 while the other ranks wait; every rank leaves together, also when
    ``work`` raises. Returns its result on rank 0 and ``{}`` elsewhere (stages that write shared
    artifacts: the data stage, embed, search spaces, the audit)."""
    if not is_main_process():
        barrier()
        return {}
    try:
        return work()
    finally:
        barrier()


def all_gather_cat(tensor):
    """Concatenate ``tensor`` from every rank along dim 0, in rank order (same shape on every rank)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def shutdown() -> None:
    """Leave the process group if one was joined."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
