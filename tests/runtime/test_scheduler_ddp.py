"""The scheduler under torch.distributed (gloo, 2 processes): one φ for all ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from falcon_cli.sampling.scheduler import NegativeScheduler

pytestmark = pytest.mark.slow  # (two processes: `make test-all`)


def record(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    s_hat = torch.softmax(torch.randn(7, 16, generator=g), dim=1)
    return {"s_hat": s_hat, "q": torch.rand(7, generator=g, dtype=torch.float64)}


def _rank(rank: int, out: str) -> None:
    # a file store: no TCP port to collide with other tests' process groups
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    try:
        torch.manual_seed(100 + rank)  # ranks seed differently, as pretraining does (seed + rank)
        scheduler = NegativeScheduler(quantiles=16, hidden=8, lr=1e-2)
        initial = [p.detach().clone() for p in scheduler.policy.parameters()]
        scheduler.update(record(rank), reward=0.5 + rank)  # different batches and rewards per rank
        torch.save(
            {"initial": initial, "after": [p.detach().clone() for p in scheduler.policy.parameters()]},
            f"{out}/rank{rank}.pt",
        )
        dist.barrier()  # both ranks done with the group before either tears it down
    finally:
        dist.destroy_process_group()


def test_ranks_share_phi_and_average_their_gradients(tmp_path):
    mp.spawn(_rank, args=(str(tmp_path),), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for a, b in zip(r0["initial"], r1["initial"]):
        assert torch.equal(a, b), "rank 1 must start from rank 0's parameters"
    for a, b in zip(r0["after"], r1["after"]):
        assert torch.equal(a, b), "one update later the ranks still agree"
    # a single process with rank 0's φ and the mean of the two ranks' losses (mean of gradients)
    single = NegativeScheduler(quantiles=16, hidden=8, lr=1e-2)
    with torch.no_grad():
        for p, init in zip(single.policy.parameters(), r0["initial"]):
            p.copy_(init)
    from falcon_cli.sampling.policy import beta_log_prob, reinforce_loss

    losses = []
    for rank in (0, 1):
        rec = record(rank)
        alpha, beta = single.policy(rec["s_hat"])
        losses.append(reinforce_loss(0.5 + rank, beta_log_prob(alpha, beta, rec["q"].float()).sum()))
    single.optimizer.zero_grad()
    (sum(losses) / 2).backward()
    single.optimizer.step()
    for p, expected in zip(single.policy.parameters(), r0["after"]):
        assert torch.allclose(p, expected, atol=1e-6)
