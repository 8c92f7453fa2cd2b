"""Zero-shot retrieval with ITC similarity: embed a retrieval split, score all pairs, recall@K."""

from __future__ import annotations

import torch

from falcon_cli.data.retrieval import ids_from_entries
from falcon_cli.data.shapes.oracle import ShapesOracle
from falcon_cli.evaluation.multi_positive import fn_aware_retrieval
from falcon_cli.evaluation.retrieval import recall_at_k
from falcon_cli.evaluation.scoring import embed_split


@torch.no_grad()
def itc_scores(
    model,
    dataset,
    tokenizer,
    device: torch.device,
    *,
    batch_size: int = 64,
    max_length: int = 25,
    autocast=None,
    num_workers: int = 0,
) -> torch.Tensor:
    """[n_images, n_texts] cosine similarities of a :class:`RetrievalEvalDataset` under ``model``."""
    return embed_split(
        model,
        dataset,
        tokenizer,
        device,
        batch_size=batch_size,
        max_length=max_length,
        autocast=autocast,
        num_workers=num_workers,
        keep_tokens=False,
    ).similarity()


def zero_shot_retrieval(
    model, dataset, tokenizer, device: torch.device, *, positives: torch.Tensor | None = None, **kwargs
) -> dict[str, float]:
    """ITC-only recall@1/5/10 in both directions (percent) on a retrieval eval split. With ``positives`` (bool
    [n_images, n_texts], every true pair: :func:`oracle_positives`) also the false-negative-aware metrics, keyed
    ``oracle_…`` as ``falcon evaluate`` keys them."""
    scores = itc_scores(model, dataset, tokenizer, device, **kwargs).cpu()
    result = recall_at_k(scores, *split_targets(dataset))
    if positives is not None:
        result.update(fn_aware_retrieval(scores, positives, "oracle"))
    return result


def oracle_positives(spec, dataset, oracle: ShapesOracle | None = None) -> torch.Tensor | None:
    """bool [n_images, n_texts]: which captions of a retrieval split truly describe which of its images, by the
    shapes world's oracle (``oracle``: the world's, already loaded); None when the dataset is not a shapes world or
    its entries carry no image and caption ids (``falcon evaluate`` says why where the metric was asked for)."""
    if spec.shapes_world is None:
        return None
    ids = ids_from_entries(dataset.records)
    if ids is None:
        return None
    oracle = oracle or ShapesOracle.load(spec.resolve(spec.shapes_world))
    return torch.from_numpy(oracle.matrix(ids.image_ids, ids.caption_ids))


def split_targets(dataset) -> tuple[list[list[int]], list[int]]:
    """``(img2txt, txt2img)`` of a retrieval eval split as lists (image -> its captions, caption -> its image)."""
    return [dataset.img2txt[i] for i in range(len(dataset))], [dataset.txt2img[t] for t in range(len(dataset.text))]
