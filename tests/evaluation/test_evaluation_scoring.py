"""Retrieval scoring: ITC for all pairs, the top k re-ranked by ITM, sharded over ranks."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from falcon_cli.evaluation.retrieval import recall_at_k
from falcon_cli.evaluation.scoring import OUTSIDE_TOP_K, SplitEmbeddings, rerank, retrieval_scores, shard_rows
from falcon_cli.models.registry import create_model


def pair_score(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """A known re-ranking score: prefers the column whose index is closest to 3 * row."""
    return -(cols.float() - 3 * rows.float()).abs()


def reference_rerank(sim: torch.Tensor, k: int) -> torch.Tensor:
    out = sim - OUTSIDE_TOP_K
    for i in range(sim.shape[0]):
        for j in sim[i].topk(min(k, sim.shape[1])).indices.tolist():
            out[i, j] = pair_score(torch.tensor([i]), torch.tensor([j]))[0]
    return out


@pytest.mark.parametrize("k", [1, 3, 20])
def test_rerank_matches_a_loop(k):
    sim = torch.randn(7, 12, generator=torch.Generator().manual_seed(k))
    out = rerank(sim, k, pair_score, batch_size=5)
    assert torch.allclose(out, reference_rerank(sim, k))
    # Re-ranked entries rank above every other one, whatever their score.
    top = sim.topk(min(k, 12), dim=1).indices
    assert k >= 12 or (out.gather(1, top).min(dim=1).values > out.scatter(1, top, float("inf")).min(dim=1).values).all()


def test_shards_cover_every_row_once():
    for n in (0, 1, 7, 100):
        for world in (1, 2, 3, 8):
            blocks = [shard_rows(n, r, world) for r in range(world)]
            covered = [i for start, stop in blocks for i in range(start, stop)]
            assert covered == list(range(n))


def _tiny_split(n_images: int = 4, n_texts: int = 6):
    torch.manual_seed(0)
    model = create_model("albef-tiny", vocab_size=50).eval()
    images = torch.randn(n_images, 3, 64, 64)
    ids = torch.randint(5, 50, (n_texts, 7))
    mask = torch.ones_like(ids)
    mask[::2, 5:] = 0  # some padding, which re-ranking trims per chunk
    with torch.no_grad():
        image_tokens, image_feat = model.encode_image(images)
        text_tokens, text_feat = model.encode_text(ids, mask)
    return model, SplitEmbeddings(image_tokens, image_feat, text_tokens, mask, text_feat)


def full_itm(model, e: SplitEmbeddings) -> torch.Tensor:
    """The ITM match logit of every (image, text) pair, one pair at a time, untrimmed."""
    out = torch.empty(len(e.image_feat), len(e.text_feat))
    with torch.no_grad():
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                fused = model.fuse(e.text_tokens[j : j + 1], e.text_mask[j : j + 1], e.image_tokens[i : i + 1])
                out[i, j] = model.itm_logits(fused)[0, 1]
    return out


def test_itm_reranking_with_k_all_is_the_itm_ranking():
    model, e = _tiny_split()
    i2t, t2i = retrieval_scores(model, e, k=100, batch_size=5)
    itm = full_itm(model, e)
    assert torch.allclose(i2t, itm, atol=1e-4) and torch.allclose(t2i, itm.t(), atol=1e-4)
    sims = e.similarity()
    i2t_itc, t2i_itc = retrieval_scores(model, e, k=None)
    assert torch.equal(i2t_itc, sims) and torch.equal(t2i_itc, sims.t())
    # k = 2: only each query's ITC top 2 carry ITM logits.
    i2t, t2i = retrieval_scores(model, e, k=2, batch_size=3)
    top = sims.topk(2, dim=1).indices
    assert torch.allclose(i2t.gather(1, top), itm.gather(1, top), atol=1e-4)
    rest = torch.ones_like(sims, dtype=torch.bool).scatter(1, top, False)
    assert torch.allclose(i2t[rest], (sims - OUTSIDE_TOP_K)[rest])
    top_t = sims.t().topk(2, dim=1).indices
    assert torch.allclose(t2i.gather(1, top_t), itm.t().gather(1, top_t), atol=1e-4)


def test_recall_with_separate_directions():
    # Two images with two captions each; text-to-image scores disagree with the transpose.
    i2t = torch.tensor([[0.9, 0.1, 0.8, 0.0], [0.0, 0.7, 0.2, 0.6]])
    t2i = torch.tensor([[0.1, 0.9], [0.0, 1.0], [0.2, 0.1], [0.9, 0.3]])
    out = recall_at_k(i2t, [[0, 1], [2, 3]], [0, 0, 1, 1], ks=(1,), scores_t2i=t2i)
    assert out["i2t_R@1"] == 50.0  # image 0 ranks its text 0 first; image 1 ranks text 1 (not its own) first
    assert out["t2i_R@1"] == 0.0  # every text ranks the other image first under t2i
    assert recall_at_k(i2t, [[0, 1], [2, 3]], [0, 0, 1, 1], ks=(1,))["t2i_R@1"] == 50.0  # the transpose differs


def _sharded(rank: int, out: str, k: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    try:
        model, e = _tiny_split(5, 9)
        i2t, t2i = retrieval_scores(model, e, k=k, batch_size=4)
        torch.save({"i2t": i2t, "t2i": t2i}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # (two processes: `make test-all`)
def test_sharded_scores_equal_single_process(tmp_path):
    mp.spawn(_sharded, args=(str(tmp_path), 3), nprocs=2, join=True)
    model, e = _tiny_split(5, 9)
    i2t, t2i = retrieval_scores(model, e, k=3, batch_size=4)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.allclose(got["i2t"], i2t, atol=1e-5) and torch.allclose(got["t2i"], t2i, atol=1e-5)
