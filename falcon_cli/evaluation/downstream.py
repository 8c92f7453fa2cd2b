"""Run a fine-tuned VQA or NLVR2 model over a split, sharded across ranks under torchrun.

Each rank takes a contiguous block of the split (:func:`~falcon_cli.evaluation.scoring.shard_rows`);
VQA answers are gathered on every rank, NLVR2 counts are summed.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.data import DataLoader, Subset

from falcon_cli.evaluation.scoring import shard_rows
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.progress import track


def _shard(dataset) -> Subset:
    start, stop = shard_rows(len(dataset))
    return Subset(dataset, range(start, stop))


@torch.no_grad()
def answer_questions(
    model,
    dataset,
    collate,
    answer_ids: torch.Tensor,
    answer_mask: torch.Tensor,
    answers: list[str],
    device: torch.device,
    *,
    k: int = 128,
    batch_size: int = 32,
    num_workers: int = 0,
    autocast=None,
) -> dict:
    """``{question_id: answer}`` for every question of a :class:`~falcon_cli.data.vqa.VQADataset`: the
    candidate (``answers``, tokenised as ``answer_ids``/``answer_mask``) the model's decoder ranks first
    (first-token top ``k``, then full-sequence likelihood)."""
    autocast = autocast or contextlib.nullcontext()
    was_training = model.training
    model.eval()
    answer_ids, answer_mask = answer_ids.to(device), answer_mask.to(device)
    predictions: dict = {}
    loader = DataLoader(_shard(dataset), batch_size=batch_size, collate_fn=collate, num_workers=num_workers)
    for batch in track(loader, "answering questions"):
        with autocast:
            states = model.encode_question(
                batch["image"].to(device), batch["question_ids"].to(device), batch["question_mask"].to(device)
            )
            best = model.rank_answers(states, batch["question_mask"].to(device), answer_ids, answer_mask, k)
        predictions.update({qid: answers[int(i)] for qid, i in zip(batch["question_id"], best.tolist())})
    model.train(was_training)
    if D.world_size() > 1:
        import torch.distributed as dist

        parts = [None] * D.world_size()
        dist.all_gather_object(parts, predictions)
        predictions = {qid: a for part in parts for qid, a in part.items()}
    return predictions


@torch.no_grad()
def nlvr2_accuracy(
    model, dataset, collate, device: torch.device, *, batch_size: int = 32, num_workers: int = 0, autocast=None
) -> float:
    """Accuracy (percent) of an :class:`~falcon_cli.models.nlvr2.AlbefNLVR2` on an NLVR2 split."""
    autocast = autocast or contextlib.nullcontext()
    was_training = model.training
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # correct, total
    loader = DataLoader(_shard(dataset), batch_size=batch_size, collate_fn=collate, num_workers=num_workers)
    for batch in track(loader, "NLVR2 statements"):
        with autocast:
            logits = model(
                batch["images0"].to(device),
                batch["images1"].to(device),
                batch["input_ids"].to(device),
                batch["attention_mask"].to(device),
                head="nlvr",
            )
        counts[0] += (logits.argmax(dim=1).cpu() == batch["labels"]).sum().item()
        counts[1] += len(batch["labels"])
    model.train(was_training)
    if D.world_size() > 1:
        import torch.distributed as dist

        dist.all_reduce(counts)
    return 100.0 * float(counts[0] / counts[1].clamp_min(1))


__all__ = ["answer_questions", "nlvr2_accuracy"]
