"""GloFND under torch.distributed (gloo, 2 processes): every rank ends with every rank's threshold updates."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from falcon_cli.objectives.false_negatives import Glofnd, StepContext

pytestmark = pytest.mark.slow  # (two processes: `make test-all`)

PAIRS = torch.arange(0, 40, 3)  # 14 pair ids, not contiguous


def features(rank: int):
    g = torch.Generator().manual_seed(rank)
    image, text = torch.nn.functional.normalize(torch.randn(2, 6, 8, generator=g), dim=2)
    return image, text, PAIRS[rank * 6 : (rank + 1) * 6]  # disjoint batches, as the shards are


def _rank(rank: int, out: str, adam_step: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    try:
        method = Glofnd(PAIRS, alpha=0.2, lr=0.3, start_epoch=1, adam_step=adam_step)
        image, text, ids = features(rank)
        method.itc(image, text, torch.tensor(0.07), 0.0, StepContext(ids, epoch=2))
        torch.save(method.thresholds.state_dict(), f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("adam_step", ["epoch", "count"])
def test_ranks_share_their_threshold_updates(tmp_path, adam_step):
    mp.spawn(_rank, args=(str(tmp_path), adam_step), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0.keys() == r1.keys()
    for name in r0:
        assert torch.equal(r0[name], r1[name]), f"ranks disagree on {name}"
    # One process updating the two batches one after the other reaches the same state (batches are disjoint).
    single = Glofnd(PAIRS, alpha=0.2, lr=0.3, start_epoch=1, adam_step=adam_step)
    for rank in (0, 1):
        image, text, ids = features(rank)
        single.itc(image, text, torch.tensor(0.07), 0.0, StepContext(ids, epoch=2))
    for name, value in single.thresholds.state_dict().items():
        assert torch.equal(value, r0[name]), name
    assert (r0["lambda_image"][:12] < 1).all() and (r0["lambda_image"][12:] == 1).all(), "only the batches' pairs moved"
