"""Rank and world size from the environment (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from falcon_cli.errors import FalconError, Refused


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


def where() -> str:
    """This process for a message: ``node N (host, rank R)`` (N: torchrun's node rank, GROUP_RANK)."""
    return f"node {os.environ.get('GROUP_RANK', '?')} ({socket.gethostname()}, rank {rank()})"


def gather_objects(obj: Any) -> list:
    """``obj`` from every rank, in rank order (``[obj]`` when single-process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, obj)
    return parts


def broadcast_object(obj: Any, src: int) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def flat_items(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{"a.b.c": leaf}`` (lists are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    items: dict[str, Any] = {}
    for key, inner in value.items():
        items.update(flat_items(inner, f"{prefix}.{key}" if prefix else str(key)))
    return items


def launch_digest(launch: dict) -> str:
    """sha256 of a launch description (its JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(launch, sort_keys=True, default=str).encode()).hexdigest()


def first_difference(mine: dict, theirs: dict) -> str | None:
    """The first key (dotted, sorted) whose value differs between two nested dicts, with both values."""
    a, b = flat_items(mine), flat_items(theirs)
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            return f"{key} is {_short(a.get(key, '<unset>'))} there and {_short(b.get(key, '<unset>'))} on rank 0"
    return None


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_same_launch(launch: dict) -> None:
    """Every rank was started with the same ``launch`` (the resolved config, the run directory, the command and its
    options), else every rank raises :class:`Refused` with one line naming the first rank that differs from rank 0
    (node, host, rank) and its first differing key. A collective: call it on every rank, before anything is written
    (or where a :class:`Refused` puts the run's record back). No-op when single-process."""
    if world_size() <= 1:
        return
    everyone = gather_objects({"where": where(), "digest": launch_digest(launch)})
    odd = [r for r, e in enumerate(everyone) if e["digest"] != everyone[0]["digest"]]
    if not odd:
        return
    # (only now, and only two ranks' worth: the first differing key)
    reference, other = broadcast_object(launch, 0), broadcast_object(launch, odd[0])
    key = first_difference(other, reference)
    more = f" (and {len(odd) - 1} more rank(s))" if len(odd) > 1 else ""
    raise Refused(f"{everyone[odd[0]]['where']}{more} was launched with another config than rank 0 on "
                  f"{everyone[0]['where']}: {key}; launch every node with the same recipe and overrides "
                  "(nothing in the run directory was changed)")


def check_shared_file(path: str | Path, what: str, *, wait_s: float = 20.0) -> None:
    """Every rank sees the file rank 0 has just written at ``path`` byte for byte, else every rank raises
    :class:`Refused` naming the first rank that does not: on a cluster the run directory must be on a filesystem
    every node mounts at the same path (rank 0 writes what every rank reads back: checkpoints on ``--resume``,
    search spaces, embeddings). Waits up to ``wait_s`` for a network filesystem's cache to catch up first.
    A collective; no-op when single-process."""
    if world_size() <= 1:
        return
    path = Path(path)
    expected = broadcast_object(_file_digest(path) if is_main_process() else None, 0)
    problem = None if is_main_process() else _sees(path, expected, wait_s)
    everyone = gather_objects({"where": where(), "problem": problem})
    bad = [e for e in everyone if e["problem"] is not None]
    if bad:
        more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
        raise Refused(f"{bad[0]['where']}{more} cannot see the {what} rank 0 wrote: {path} {bad[0]['problem']}; "
                      f"every node must see the {what} at the same path: put --run-dir on a filesystem all nodes "
                      "share (docs/cluster.md)")


def _file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _sees(path: Path, expected: str | None, wait_s: float) -> str | None:
    """None when ``path`` holds the bytes whose digest is ``expected``, else why not (after waiting ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        digest = _file_digest(path)
        if digest == expected:
            return None
        if time.monotonic() >= deadline:
            return "does not exist here" if digest is None else "holds other contents here"
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))


def shutdown() -> None:
    """Leave the process group if one was joined."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
