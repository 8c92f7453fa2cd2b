"""ECCV Caption / CxC / COCO 5K metrics through eccv_caption, and the native COCO 1K recall."""

from __future__ import annotations

import warnings

import pytest
import torch

eccv_caption = pytest.importorskip("eccv_caption")

from falcon_cli.errors import FalconError  # noqa: E402
from falcon_cli.evaluation.eccv import (  # noqa: E402
    coco_1k_recalls,
    eccv_metrics,
    eccv_metrics_from_rankings,
    eccv_version,
)
from falcon_cli.evaluation.intervals import wilson_interval  # noqa: E402
from falcon_cli.evaluation.multi_positive import multi_positive_metrics, stable_topk_indices  # noqa: E402
from falcon_cli.evaluation.retrieval import recall_at_k  # noqa: E402


@pytest.fixture(scope="module")
def coco():
    """The package's ground truth and the Karpathy 5K test split in its order (5 captions per image)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric = eccv_caption.Metrics()
    caption_ids = [int(c) for c in metric.coco_ids]
    image_ids = list(dict.fromkeys(metric.coco_gts["t2i"][c][0] for c in caption_ids))
    image_index = {i: n for n, i in enumerate(image_ids)}
    caption_index = {c: n for n, c in enumerate(caption_ids)}
    txt2img = [image_index[metric.coco_gts["t2i"][c][0]] for c in caption_ids]
    img2txt = [[] for _ in image_ids]
    for t, i in enumerate(txt2img):
        img2txt[i].append(t)
    return {
        "metric": metric,
        "image_ids": image_ids,
        "caption_ids": caption_ids,
        "image_index": image_index,
        "caption_index": caption_index,
        "txt2img": txt2img,
        "img2txt": img2txt,
    }


@pytest.fixture(scope="module")
def noisy_scores(coco):
    """[5000, 25000] float32 (500 MB): Gaussian noise with each image's own captions lifted by 3.5."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(len(coco["image_ids"]), len(coco["caption_ids"]), generator=generator)
    scores[torch.tensor(coco["txt2img"]), torch.arange(len(coco["caption_ids"]))] += 3.5
    yield scores
    del scores


def positives_matrix(gt, row_index, col_index, shape):
    """Boolean [rows, cols] from ``{row id: [col ids]}``; the row positions of the queries."""
    positives = torch.zeros(shape, dtype=torch.bool)
    for q, items in gt.items():
        positives[row_index[q], [col_index[i] for i in items]] = True
    return positives


def test_version():
    assert eccv_version() == "0.1.0"


def test_perfect_rankings_give_100(coco):
    """Ranked lists built from the package's own ground truth: ECCV and COCO 5K at 100."""
    metric = coco["metric"]
    lists = {}
    for direction, all_items in (("i2t", coco["caption_ids"]), ("t2i", coco["image_ids"])):
        eccv, original = metric.eccv_gts[direction], metric.coco_gts[direction]
        lists[direction] = {}
        for q, own in original.items():
            positives = eccv.get(q, [])
            first = [i for i in positives if i in own] + [i for i in positives if i not in own]
            head = first + [i for i in own if i not in first]
            filler = [i for i in all_items[:60] if i not in head]
            lists[direction][q] = (head + filler)[: max(50, len(head))]
    result = eccv_metrics_from_rankings(lists["i2t"], lists["t2i"])
    for direction in ("i2t", "t2i"):
        for key in ("R@1", "R-P", "mAP@R"):
            assert result[f"eccv_{direction}_{key}"] == pytest.approx(100.0)
        for k in (1, 5, 10):
            assert result[f"coco5k_{direction}_R@{k}"] == pytest.approx(100.0)
            assert 95.0 < result[f"cxc_{direction}_R@{k}"] <= 100.0


def test_score_matrix_path_matches_native_metrics(coco, noisy_scores):
    """Through the score matrix: keys, and the package's numbers on top-50 lists equal falcon's
    own computation on the full matrix (ECCV R@1/R-P/mAP@R, COCO 5K R@K)."""
    metric = coco["metric"]
    result = eccv_metrics(noisy_scores, coco["image_ids"], coco["caption_ids"])
    assert set(result) == (
        {f"eccv_{d}_{m}" for d in ("i2t", "t2i") for m in ("R@1", "R-P", "mAP@R")}
        | {f"{s}_{d}_R@{k}" for s in ("cxc", "coco5k") for d in ("i2t", "t2i") for k in (1, 5, 10)}
    )
    assert 20.0 < result["coco5k_i2t_R@1"] < 95.0 and 20.0 < result["coco5k_t2i_R@1"] < 95.0  # non-trivial
    image_index, caption_index = coco["image_index"], coco["caption_index"]
    n_texts = len(caption_index)
    # COCO 5K: i2t through multi-positive R@K, t2i as the rank of the own image (ties to the lower index).
    txt2img = torch.tensor(coco["txt2img"])
    own = torch.zeros(noisy_scores.shape, dtype=torch.bool)
    own[txt2img, torch.arange(n_texts)] = True
    native = multi_positive_metrics(noisy_scores, own)
    del own
    ranks = []
    for start in range(0, n_texts, 5000):  # column chunks keep the peak memory low
        cols = slice(start, start + 5000)
        block, image = noisy_scores[:, cols], txt2img[cols]
        own_scores = block[image, torch.arange(block.shape[1])]
        before = torch.arange(len(image_index))[:, None] < image[None, :]
        ranks.append((block > own_scores).sum(0) + ((block == own_scores) & before).sum(0))
    ranks = torch.cat(ranks)
    for k in (1, 5, 10):
        assert result[f"coco5k_i2t_R@{k}"] == pytest.approx(native[f"R@{k}"], abs=1e-9)
        assert result[f"coco5k_t2i_R@{k}"] == pytest.approx(100.0 * (ranks < k).double().mean().item(), abs=1e-9)
        # CxC adds positives to COCO's (29 images miss one of their own captions in CxC).
        assert result[f"cxc_i2t_R@{k}"] >= result[f"coco5k_i2t_R@{k}"] - 1.0
    # ECCV on the query rows only. Quirk: 2 ECCV i2t positives are captions outside the 25,000
    # of the split; they are never retrieved but count in R, so they become columns ranked last.
    gts = metric.eccv_gts
    outside = sorted({c for items in gts["i2t"].values() for c in items if c not in caption_index})
    assert len(outside) == 2
    images = list(gts["i2t"])
    columns = caption_index | {c: n_texts + n for n, c in enumerate(outside)}
    i2t_scores = torch.cat(
        [
            noisy_scores[torch.tensor([image_index[q] for q in images])],
            torch.full((len(images), len(outside)), float("-inf")),
        ],
        dim=1,
    )
    i2t = positives_matrix(gts["i2t"], {q: n for n, q in enumerate(images)}, columns, tuple(i2t_scores.shape))
    captions = list(gts["t2i"])
    t2i_scores = noisy_scores[:, torch.tensor([caption_index[c] for c in captions])].t()
    t2i = positives_matrix(gts["t2i"], {c: n for n, c in enumerate(captions)}, image_index, tuple(t2i_scores.shape))
    for direction, scores, positives in (("i2t", i2t_scores, i2t), ("t2i", t2i_scores, t2i)):
        native = multi_positive_metrics(scores, positives, ks=(1,))
        assert native["queries"] == len(gts[direction])
        for key in ("R@1", "R-P", "mAP@R"):
            assert result[f"eccv_{direction}_{key}"] == pytest.approx(native[key], abs=1e-9), (direction, key)


def test_coco_1k_matches_package(coco, noisy_scores):
    """Native COCO 1K equals eccv_caption's coco_1k_recalls fed with each fold's own top-10 lists."""
    ours = coco_1k_recalls(noisy_scores, coco["img2txt"], coco["txt2img"])
    assert 20.0 < ours["coco1k_i2t_R@1"] < 99.0
    metric = coco["metric"]
    image_ids = torch.tensor(coco["image_ids"])
    caption_ids = torch.tensor(coco["caption_ids"])
    i2t, t2i = {}, {}
    for fold in range(5):
        rows = slice(fold * 1000, (fold + 1) * 1000)
        cols = slice(fold * 5000, (fold + 1) * 5000)  # Karpathy order: 5 consecutive captions per image
        block = noisy_scores[rows, cols]
        i2t.update(zip(image_ids[rows].tolist(), caption_ids[cols][stable_topk_indices(block, 10)].tolist()))
        t2i.update(zip(caption_ids[cols].tolist(), image_ids[rows][stable_topk_indices(block.t(), 10)].tolist()))
    for k in (1, 5, 10):
        package = metric.coco_1k_recalls({"i2t": i2t, "t2i": t2i}, "all", K=k)
        assert ours[f"coco1k_i2t_R@{k}"] == pytest.approx(100.0 * package["i2t"], abs=1e-9)
        assert ours[f"coco1k_t2i_R@{k}"] == pytest.approx(100.0 * package["t2i"], abs=1e-9)


def test_coco_1k_small_hand_case():
    """4 images, 2 folds: the average of recall_at_k on each fold's own block."""
    torch.manual_seed(0)
    img2txt = [[0, 1], [2], [3, 4], [5]]
    txt2img = [0, 0, 1, 2, 2, 3]
    scores = torch.randn(4, 6)
    got = coco_1k_recalls(scores, img2txt, txt2img, folds=2, ks=(1, 2))
    fold_a = recall_at_k(scores[:2, :3], [[0, 1], [2]], [0, 0, 1], ks=(1, 2))
    fold_b = recall_at_k(scores[2:, 3:], [[0, 1], [2]], [0, 0, 1], ks=(1, 2))
    for key in (k for k in fold_a if not k.endswith(("_lo", "_hi"))):
        assert got[f"coco1k_{key}"] == pytest.approx((fold_a[key] + fold_b[key]) / 2)
    for key, queries in (("i2t_R@1", 4), ("t2i_R@2", 6)):  # the interval is over every query of the direction
        assert (got[f"coco1k_{key}_lo"], got[f"coco1k_{key}_hi"]) == pytest.approx(
            wilson_interval(got[f"coco1k_{key}"], queries)
        )
    # A perfect diagonal with a strong cross-fold distractor: the distractor is outside the fold.
    scores = torch.zeros(4, 6)
    scores[torch.tensor(txt2img), torch.arange(6)] = 1.0
    scores[0, 5] = 5.0  # image 0 would pick text 5 (fold 2) in a 5K ranking
    got = coco_1k_recalls(scores, img2txt, txt2img, folds=2, ks=(1,))
    assert got["coco1k_i2t_R@1"] == 100.0 and got["coco1k_t2i_R@1"] == 100.0
    with pytest.raises(FalconError, match="equal folds"):
        coco_1k_recalls(torch.zeros(5, 6), img2txt + [[]], txt2img, folds=2)


def test_missing_ids_error(coco):
    scores = torch.zeros(10, 50)
    with pytest.raises(FalconError, match=r"4990 of 5000 COCO test image ids .*Karpathy 5K test.*caption_ids"):
        eccv_metrics(scores, coco["image_ids"][:10], coco["caption_ids"][:50])
    with pytest.raises(FalconError, match="image ids"):
        eccv_metrics(scores, coco["image_ids"][:9], coco["caption_ids"][:50])
