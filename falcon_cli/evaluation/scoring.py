"""Retrieval scores under ALBEF's and BLIP-2's protocol: ITC similarity for all pairs, the top k re-ranked by ITM.

1. Every image and every text of the split is encoded once (:func:`embed_split`); the unimodal
   tokens are kept, because re-ranking fuses them again.
2. ``sims = image_feat @ text_feat.T`` ranks all pairs (the ``--itc-only`` result).
   (BLIP-2: each image's best query, :func:`~falcon_cli.objectives.common.image_text_similarity`).
3. For each image the top ``k`` texts by ITC, and for each text the top ``k`` images, are scored
   with the model's ITM match logit (class 1; not a softmax): ALBEF's rule re-ranks by the logit
   alone; LAVIS's BLIP-2 rule (``add_itc``) by the logit plus the ITC cosine. Entries outside the
   top ``k`` keep their ITC order below every re-ranked one.

Re-ranking is sharded: under torchrun each rank scores a contiguous block of query rows and the
blocks are summed across ranks (every other rank holds zeros there), so all ranks end with the
same two matrices.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from falcon_cli.data.collate import tokenize
from falcon_cli.objectives.common import image_text_similarity
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.progress import track

OUTSIDE_TOP_K = 1000.0
"""Subtracted from the ITC similarity of pairs that are not re-ranked, so they rank below every
re-ranked pair (ITM logits are far smaller) but keep their ITC order among themselves."""


@dataclass
class SplitEmbeddings:
    """A retrieval split encoded once: what ITC ranking and ITM re-ranking need."""

    image_tokens: Tensor
    """[n_images, 1 + patches, vision_width] image-encoder tokens."""
    image_feat: Tensor
    """[n_images, embed_dim] (BLIP-2: [n_images, queries, embed_dim]) unit-norm float32 ITC features."""
    text_tokens: Tensor
    """[n_texts, L, text_width] text-encoder tokens."""
    text_mask: Tensor
    """[n_texts, L] padding mask (1 = token)."""
    text_feat: Tensor
    """[n_texts, embed_dim] unit-norm float32 ITC features."""
    text_ids: Tensor | None = None
    """[n_texts, L] token ids (BLIP-2's ITM runs the Q-Former over the ids, not over encoder tokens)."""

    def similarity(self) -> Tensor:
        """[n_images, n_texts] ITC cosine similarities (float32; BLIP-2: the best query's)."""
        return image_text_similarity(self.image_feat, self.text_feat)


@torch.no_grad()
def embed_split(
    model,
    dataset,
    tokenizer,
    device: torch.device,
    *,
    batch_size: int = 64,
    max_length: int = 30,
    autocast=None,
    num_workers: int = 0,
    keep_tokens: bool = True,
) -> SplitEmbeddings:
    """Encode every text and image of a :class:`~falcon_cli.data.retrieval.RetrievalEvalDataset` with ``model``.

    Texts are tokenised together (padded to the longest, at most ``max_length`` tokens), so all
    text tokens share one length. Tokens are stored in the autocast dtype (half the memory on GPU);
    ``keep_tokens=False`` keeps only the ITC features (ITC-only ranking needs nothing else).
    """
    autocast = autocast or contextlib.nullcontext()
    was_training = model.training
    model.eval()
    input_ids, text_mask = (t.to(device) for t in tokenize(tokenizer, dataset.text, max_length))
    text_tokens, text_feat = [], []
    for start in track(range(0, len(input_ids), batch_size), "encoding texts"):
        with autocast:
            tokens, feat = model.encode_text(
                input_ids[start : start + batch_size], text_mask[start : start + batch_size]
            )
        text_tokens.append(tokens if keep_tokens else tokens[:, :0])
        text_feat.append(feat.float())
    image_tokens, image_feat = [], []
    # A generator of its own: a DataLoader without one draws its workers' base seed from the global RNG, so an
    # evaluation inside training (the learning curve) would change the dropout and masks of every later step.
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        generator=torch.Generator(),
    )
    for batch in track(loader, "encoding images"):
        with autocast:
            tokens, feat = model.encode_image(batch["image"].to(device, non_blocking=True))
        image_tokens.append(tokens if keep_tokens else tokens[:, :0])
        image_feat.append(feat.float())
    model.train(was_training)
    return SplitEmbeddings(
        torch.cat(image_tokens),
        torch.cat(image_feat),
        torch.cat(text_tokens),
        text_mask,
        torch.cat(text_feat),
        input_ids,
    )


def shard_rows(n: int, rank: int | None = None, world: int | None = None) -> tuple[int, int]:
    """The contiguous block ``[start, stop)`` of ``n`` query rows that ``rank`` of ``world`` scores."""
    rank = D.rank() if rank is None else rank
    world = D.world_size() if world is None else world
    step = -(-n // world)
    return min(n, rank * step), min(n, (rank + 1) * step)


@torch.no_grad()
def rerank(
    similarity: Tensor,
    k: int,
    score_pairs: Callable[[Tensor, Tensor], Tensor],
    *,
    batch_size: int = 64,
    description: str = "re-ranking",
) -> Tensor:
    """Re-score each row's top ``k`` columns of ``similarity`` [Q, C] with ``score_pairs(rows, cols)``
    (int64 [P] each -> float [P]); other entries become ``similarity - OUTSIDE_TOP_K``.

    This rank scores its :func:`shard_rows` block; the result is summed over ranks, so every
    rank returns the full [Q, C] matrix (float32).
    """
    q, c = similarity.shape
    k = min(k, c)
    start, stop = shard_rows(q)
    out = torch.zeros(q, c, dtype=torch.float32, device=similarity.device)
    if stop > start:
        block = similarity[start:stop].float()
        top = block.topk(k, dim=1).indices  # [rows, k]
        rows = torch.arange(start, stop, device=block.device).repeat_interleave(k)
        cols = top.reshape(-1)
        logits = torch.cat(
            [
                score_pairs(rows[s : s + batch_size], cols[s : s + batch_size]).float()
                for s in track(range(0, len(rows), batch_size), description)
            ]
        )
        out[start:stop] = (block - OUTSIDE_TOP_K).scatter_(1, top, logits.view(stop - start, k))
    if D.world_size() > 1:
        import torch.distributed as dist

        dist.all_reduce(out)
    return out


@torch.no_grad()
def retrieval_scores(
    model, embeddings: SplitEmbeddings, *, k: int | None, batch_size: int = 64, autocast=None, add_itc: bool = False
) -> tuple[Tensor, Tensor]:
    """``(scores_i2t [n_images, n_texts], scores_t2i [n_texts, n_images])``: ITC similarity, with each
    query's top ``k`` re-scored by the ITM match logit (``add_itc``: plus the ITC similarity, LAVIS's BLIP-2
    rule) (``k`` None: ITC only, the two are transposes)."""
    sims = embeddings.similarity()
    if k is None:
        return sims, sims.t()
    autocast = autocast or contextlib.nullcontext()
    was_training = model.training
    model.eval()
    e = embeddings

    def itm(image_index: Tensor, text_index: Tensor) -> Tensor:
        mask = e.text_mask[text_index]
        length = int(mask.sum(dim=1).max())  # texts are padded to the split's longest: trim to this chunk's
        ids = e.text_ids[text_index, :length] if e.text_ids is not None else None
        with autocast:
            logits = model.match_logits(
                e.image_tokens[image_index], e.text_tokens[text_index, :length], ids, mask[:, :length]
            ).float()
        return logits + sims[image_index, text_index] if add_itc else logits

    try:
        i2t = rerank(sims, k, lambda rows, cols: itm(rows, cols), batch_size=batch_size, description="re-ranking texts")
        t2i = rerank(
            sims.t(), k, lambda rows, cols: itm(cols, rows), batch_size=batch_size, description="re-ranking images"
        )
    finally:
        model.train(was_training)
    return i2t, t2i


__all__ = ["OUTSIDE_TOP_K", "SplitEmbeddings", "embed_split", "rerank", "retrieval_scores", "shard_rows"]
