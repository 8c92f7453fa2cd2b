"""COCO 5K false-negative-aware retrieval metrics through the ``eccv_caption`` package.

``eccv_caption`` (Chun et al., ECCV 2022; ``pip install eccv-caption``) ships the COCO,
CxC and ECCV Caption ground truth for the Karpathy 5K test split and scores ranked lists:
``{coco_image_id: [caption ids]}`` and ``{caption_id: [image ids]}``. This module turns a
[n_images, n_texts] score matrix into top-K lists (ties towards the lower index), calls the
package with both dicts passed explicitly, silences its progress bar, and returns
percentages: ``eccv_{i2t,t2i}_{R@1,R-P,mAP@R}``, ``cxc_{i2t,t2i}_R@K`` and
``coco5k_{i2t,t2i}_R@K``. COCO 1K (5 folds of 1000 images) is computed natively from the
score matrix, because the package needs full rankings for it.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Mapping, Sequence

import torch

from falcon_cli.errors import FalconError
from falcon_cli.evaluation.intervals import with_intervals
from falcon_cli.evaluation.multi_positive import multi_positive_metrics, row_block, stable_topk_indices

KS = (1, 5, 10)
COCO_TEST_IMAGES = 5000
INSTALL_HINT = "pip install eccv-caption (or pip install 'falcon-vlp[eccv]')"
SPLIT_HINT = (
    "the split must be the COCO Karpathy 5K test split with COCO ids: evaluate.retrieval.coco_captions "
    "(COCO's captions_val2014.json), or `image_id` and `caption_ids` (COCO annotation ids) in its entries"
)
_TARGETS = ("coco_5k_recalls", "cxc_recalls", "eccv_r1", "eccv_rprecision", "eccv_map_at_r")
_ECCV_KEYS = {"eccv_r1": "R@1", "eccv_rprecision": "R-P", "eccv_map_at_r": "mAP@R"}


def _package():
    """Import ``eccv_caption`` (and its ``_metrics`` module) or raise a FalconError with the fix."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "failed to import `ujson`" at import time
            import eccv_caption
            from eccv_caption import _metrics
    except ImportError as exc:
        raise FalconError(f"ECCV Caption metrics need the eccv_caption package: {INSTALL_HINT}") from exc
    return eccv_caption, _metrics


def eccv_version() -> str:
    """The installed ``eccv_caption`` version (``0.1.0`` on PyPI), for recording next to results."""
    _package()
    from importlib import metadata

    try:
        return metadata.version("eccv-caption")
    except metadata.PackageNotFoundError:
        module, _ = _package()
        return str(getattr(module, "__version__", "unknown"))


@contextlib.contextmanager
def _quiet(metrics_module):
    """Silence the package: its ECCV loop draws a tqdm bar regardless of ``verbose``."""
    original = metrics_module.tqdm

    def no_bar(iterable, *args, **kwargs):
        return iterable

    metrics_module.tqdm = no_bar
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        metrics_module.tqdm = original


def _load_metrics():
    module, metrics_module = _package()
    with _quiet(metrics_module):
        return module.Metrics(verbose=False), metrics_module


def _check_coverage(metric, image_ids, caption_ids) -> None:
    given = {"i2t": {int(i) for i in image_ids}, "t2i": {int(c) for c in caption_ids}}
    missing = {}
    for direction in ("i2t", "t2i"):
        required = set().union(*(gt[direction].keys() for gt in (metric.coco_gts, metric.cxc_gts, metric.eccv_gts)))
        missing[direction] = (len(required - given[direction]), len(required))
    if missing["i2t"][0] or missing["t2i"][0]:
        raise FalconError(
            f"{missing['i2t'][0]} of {missing['i2t'][1]} COCO test image ids and {missing['t2i'][0]} of "
            f"{missing['t2i'][1]} caption ids are missing from the evaluation: {SPLIT_HINT}"
        )


def check_ids(image_ids: Sequence[int], caption_ids: Sequence[int]) -> None:
    """Raise :class:`FalconError` unless the ids cover every query of the package's ground truth (check before scoring).

    A split that is not 5,000 images is refused before the package is even imported: the wrong split is
    the error to report first, whether or not ``eccv_caption`` is installed."""
    if len(set(image_ids)) != COCO_TEST_IMAGES:
        raise FalconError(
            f"the evaluation split has {len(set(image_ids))} images, not {COCO_TEST_IMAGES}: {SPLIT_HINT}"
        )
    _check_coverage(_load_metrics()[0], image_ids, caption_ids)


def eccv_metrics_from_rankings(i2t: Mapping[int, Sequence[int]], t2i: Mapping[int, Sequence[int]]) -> dict[str, float]:
    """ECCV, CxC and COCO 5K metrics, in percent, from ready ranked lists (best first).

    ``i2t`` maps each COCO image id to caption (annotation) ids, ``t2i`` each caption id to
    image ids. Every ground-truth query of the package must be present, and each list must
    be at least as long as the query's most positives (48 i2t, 19 t2i) and max K (10).
    """
    metric, metrics_module = _load_metrics()
    lists = {"i2t": i2t, "t2i": t2i}
    _check_coverage(metric, i2t.keys(), t2i.keys())
    for direction in ("i2t", "t2i"):
        need = max(max(KS), max(len(v) for v in metric.eccv_gts[direction].values()))
        shortest = min(len(lists[direction][q]) for q in metric.eccv_gts[direction])
        if shortest < need:
            raise FalconError(
                f"{direction} ranked lists hold only {shortest} items but ECCV mAP@R needs {need}: "
                f"pass top_k >= {need} (50 is the package's convention)"
            )
    with _quiet(metrics_module):
        raw = metric.compute_all_metrics(
            {int(k): list(v) for k, v in i2t.items()},
            {int(k): list(v) for k, v in t2i.items()},
            target_metrics=_TARGETS,
            Ks=KS,
            verbose=False,
        )
    result: dict[str, float] = {}
    for direction in ("i2t", "t2i"):
        for name, key in _ECCV_KEYS.items():
            result[f"eccv_{direction}_{key}"] = 100.0 * float(raw[name][direction])
    for source, prefix in (("cxc", "cxc"), ("coco_5k", "coco5k")):
        for direction in ("i2t", "t2i"):
            for k in KS:
                result[f"{prefix}_{direction}_R@{k}"] = 100.0 * float(raw[f"{source}_r{k}"][direction])
    return result


def _ranked_lists(
    scores: torch.Tensor, row_ids: torch.Tensor, col_ids: torch.Tensor, k: int, chunk: int = 1024
) -> dict[int, list[int]]:
    """``{row id: [column ids of the row's top-k scores]}`` as Python ints, in row chunks."""
    lists: dict[int, list[int]] = {}
    col_ids = col_ids.to(scores.device)
    for start in range(0, scores.shape[0], chunk):
        block = row_block(scores, start, start + chunk)
        top = stable_topk_indices(block, k)
        rows = row_ids[start : start + chunk].tolist()
        lists.update(zip(rows, col_ids[top].tolist()))
    return lists


def eccv_metrics(
    scores_i2t: torch.Tensor,
    image_ids: Sequence[int],
    caption_ids: Sequence[int],
    *,
    top_k: int = 50,
    scores_t2i: torch.Tensor | None = None,
) -> dict[str, float]:
    """ECCV Caption (R@1, R-P, mAP@R), CxC R@K and COCO 5K R@K, in percent, from a score matrix.

    ``scores_i2t`` is [n_images, n_texts]; ``image_ids`` are the rows' COCO image ids and
    ``caption_ids`` the columns' COCO annotation ids (Karpathy 5K test). Top-``top_k`` lists
    are built both ways and scored by ``eccv_caption``. Keys: ``eccv_i2t_R@1``,
    ``eccv_i2t_R-P``, ``eccv_i2t_mAP@R``, ``cxc_i2t_R@1/5/10``, ``coco5k_i2t_R@1/5/10`` and
    the same for ``t2i``. ``scores_t2i`` [n_texts, n_images] ranks images per caption (default: the
    transpose; ITM re-ranking scores the two directions differently).
    """
    _package()
    if scores_i2t.dim() != 2:
        raise FalconError(f"scores_i2t must be an [n_images, n_texts] matrix, got shape {tuple(scores_i2t.shape)}")
    n_images, n_texts = scores_i2t.shape
    if len(image_ids) != n_images or len(caption_ids) != n_texts:
        raise FalconError(
            f"scores_i2t is {n_images} x {n_texts} but {len(image_ids)} image ids and "
            f"{len(caption_ids)} caption ids were given: {SPLIT_HINT}"
        )
    image_ids_t = torch.as_tensor([int(i) for i in image_ids], dtype=torch.long)
    caption_ids_t = torch.as_tensor([int(c) for c in caption_ids], dtype=torch.long)
    if image_ids_t.unique().numel() != n_images or caption_ids_t.unique().numel() != n_texts:
        raise FalconError(
            f"image ids or caption ids repeat: each row must be one COCO image and each column "
            f"one caption; {SPLIT_HINT}"
        )
    if top_k < 1:
        raise FalconError(f"top_k must be at least 1, got {top_k}")
    i2t = _ranked_lists(scores_i2t, image_ids_t, caption_ids_t, min(top_k, n_texts))
    t2i = _ranked_lists(
        scores_i2t.t() if scores_t2i is None else scores_t2i, caption_ids_t, image_ids_t, min(top_k, n_images)
    )
    return eccv_metrics_from_rankings(i2t, t2i)


def coco_1k_recalls(
    scores_i2t: torch.Tensor,
    img2txt: Sequence[Sequence[int]],
    txt2img: Sequence[int],
    folds: int = 5,
    ks: Sequence[int] = KS,
    scores_t2i: torch.Tensor | None = None,
) -> dict[str, float]:
    """COCO 1K recall: the mean of ``recall_at_k``'s R@K over ``folds`` consecutive image folds.

    Images are split in order into ``folds`` equal folds (5 x 1000 on COCO 5K, in Karpathy
    order); a fold's texts are its images' captions (``scores_t2i``: see :func:`eccv_metrics`). Keys are
    ``recall_at_k``'s prefixed with ``coco1k_`` (``coco1k_i2t_R@1``, ``coco1k_t2i_R@5``, ``coco1k_mean_R``), in percent,
    each R@K with its 95% interval over all the direction's queries (``coco1k_i2t_R@1_lo`` / ``_hi``).
    """
    n_images, n_texts = scores_i2t.shape
    if folds < 1 or n_images % folds:
        raise FalconError(
            f"{n_images} images do not split into {folds} equal folds: COCO 1K needs the "
            f"5000-image Karpathy test split (or a number of images divisible by {folds})"
        )
    if len(img2txt) != n_images or len(txt2img) != n_texts:
        raise FalconError(
            f"scores_i2t is {n_images} x {n_texts} but img2txt has {len(img2txt)} images and "
            f"txt2img {len(txt2img)} texts"
        )
    size = n_images // folds
    text_image = torch.as_tensor(list(txt2img), dtype=torch.long)
    totals: dict[str, float] = {}
    for fold in range(folds):
        lo, hi = fold * size, (fold + 1) * size
        texts = ((text_image >= lo) & (text_image < hi)).nonzero().squeeze(1)
        local = {int(t): j for j, t in enumerate(texts.tolist())}
        try:
            fold_img2txt = [[local[int(t)] for t in img2txt[i]] for i in range(lo, hi)]
        except KeyError as exc:
            raise FalconError(
                f"img2txt and txt2img disagree: text {exc.args[0]} is listed under an image of fold "
                f"{fold} but txt2img points elsewhere"
            ) from None
        block = scores_i2t[lo:hi].index_select(1, texts.to(scores_i2t.device))
        block_t2i = (
            block.t() if scores_t2i is None else scores_t2i.index_select(0, texts.to(scores_t2i.device))[:, lo:hi]
        )
        i2t = torch.zeros(block.shape, dtype=torch.bool)
        for i, captions in enumerate(fold_img2txt):
            i2t[i, captions] = True
        t2i = torch.zeros(block.shape[::-1], dtype=torch.bool)
        t2i[torch.arange(len(texts)), text_image[texts] - lo] = True
        # Same values as recall_at_k (R@K: any positive in the top K, ties to the lower
        # index), through top-K selection instead of two full argsorts per fold.
        for direction, matrix, mask in (("i2t", block, i2t), ("t2i", block_t2i, t2i)):
            recalls = multi_positive_metrics(matrix, mask, ks)
            for k in ks:
                key = f"{direction}_R@{k}"
                totals[key] = totals.get(key, 0.0) + recalls[f"R@{k}"] / folds
    result = {f"coco1k_{key}": value for key, value in totals.items()}
    for key in totals:  # equal folds: the mean of the folds' recalls is the recall over all queries
        with_intervals(result, f"coco1k_{key}", n_images if key.startswith("i2t") else n_texts)
    for direction in ("i2t", "t2i"):
        result[f"coco1k_{direction}_mean"] = sum(result[f"coco1k_{direction}_R@{k}"] for k in ks) / len(ks)
    result["coco1k_mean_R"] = (result["coco1k_i2t_mean"] + result["coco1k_t2i_mean"]) / 2
    return result
