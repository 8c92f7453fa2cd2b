"""Zero-shot retrieval with ITC similarity: embed a retrieval split, score all pairs, recall@K."""

from __future__ import annotations

import torch

from falcon_cli.evaluation.retrieval import recall_at_k
from falcon_cli.evaluation.scoring import embed_split


@torch.no_grad()
def itc_scores(model, dataset, tokenizer, device: torch.device, *, batch_size: int = 64, max_length: int = 25,
               autocast=None, num_workers: int = 0) -> torch.Tensor:
    """[n_images, n_texts] cosine similarities of a :class:`RetrievalEvalDataset` under ``model``."""
    return embed_split(model, dataset, tokenizer, device, batch_size=batch_size, max_length=max_length,
                       autocast=autocast, num_workers=num_workers, keep_tokens=False).similarity()


def zero_shot_retrieval(model, dataset, tokenizer, device: torch.device, **kwargs) -> dict[str, float]:
    """ITC-only recall@1/5/10 in both directions (percent) on a retrieval eval split."""
    scores = itc_scores(model, dataset, tokenizer, device, **kwargs)
    return recall_at_k(scores.cpu(), *split_targets(dataset))


def split_targets(dataset) -> tuple[list[list[int]], list[int]]:
    """``(img2txt, txt2img)`` of a retrieval eval split as lists (image -> its captions, caption -> its image)."""
    return [dataset.img2txt[i] for i in range(len(dataset))], [dataset.txt2img[t] for t in range(len(dataset.text))]
