"""Multi-positive (false-negative-aware) R@K, R-Precision and mAP@R against a Python-loop reference."""

from __future__ import annotations

import random

import pytest
import torch

from falcon_cli.errors import FalconError
from falcon_cli.evaluation.multi_positive import fn_aware_retrieval, multi_positive_metrics, stable_topk_indices
from falcon_cli.evaluation.retrieval import recall_at_k
from tests.conftest import random_captions


def reference(scores, positives, ks):
    sums = {f"R@{k}": 0.0 for k in ks} | {"R-P": 0.0, "mAP@R": 0.0}
    queries = 0
    for q in range(scores.shape[0]):
        ranked = sorted(range(scores.shape[1]), key=lambda n: (-scores[q, n].item(), n))
        hits = [bool(positives[q, n]) for n in ranked]
        r = sum(hits)
        if r == 0:
            continue
        queries += 1
        for k in ks:
            sums[f"R@{k}"] += any(hits[:k])
        sums["R-P"] += sum(hits[:r]) / r
        found, ap = 0, 0.0
        for rank in range(r):
            if hits[rank]:
                found += 1
                ap += found / (rank + 1)
        sums["mAP@R"] += ap / r
    return {key: 100.0 * value / queries for key, value in sums.items()} | {"queries": queries}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference_with_ties_and_chunks(seed):
    torch.manual_seed(seed)
    n_queries, n_items = 37, 29
    scores = (torch.randn(n_queries, n_items) * 2).round() / 2  # many ties
    positives = torch.rand(n_queries, n_items) < torch.rand(n_queries, 1) * 0.4
    positives[:4] = False  # queries without a positive are skipped
    positives[5] = True  # every item positive
    positives[6:9, :] = False
    positives[6:9, -1] = True  # a single positive at the end of a tie-heavy row
    ks = (1, 3, 5, 10, 40)
    expected = reference(scores, positives, ks)
    for chunk in (1, 7, 1024):
        got = multi_positive_metrics(scores, positives, ks, chunk=chunk)
        assert got["queries"] == expected["queries"] == int(positives.any(dim=1).sum())
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-9), (chunk, key)


def test_stable_topk_matches_stable_argsort():
    torch.manual_seed(3)
    scores = torch.randint(0, 4, (50, 60)).float()
    for k in (1, 5, 17, 60):
        expected = scores.argsort(dim=1, descending=True, stable=True)[:, :k]
        assert torch.equal(stable_topk_indices(scores, k), expected)


def test_perfect_ranking_is_100():
    torch.manual_seed(4)
    positives = torch.rand(20, 30) < 0.2
    positives[torch.arange(20), torch.arange(20)] = True
    scores = positives.float() + 0.01 * torch.rand(20, 30)
    got = fn_aware_retrieval(scores, positives, "oracle")
    assert all(value == pytest.approx(100.0) for key, value in got.items() if not key.endswith("_lo"))
    assert set(got) == {f"oracle_{d}_{m}" for d in ("i2t", "t2i") for m in ("R@1", "R@5", "R@10", "R-P", "mAP@R")} | {
        "oracle_mean_R"
    } | {f"oracle_{d}_R@{k}_{end}" for d in ("i2t", "t2i") for k in (1, 5, 10) for end in ("lo", "hi")}
    # 20 images and 30 texts found every time: Wilson's lower bounds, 100 n / (n + z^2)
    assert got["oracle_i2t_R@1_lo"] == pytest.approx(100 * 20 / (20 + 1.96**2), abs=0.01)
    assert got["oracle_t2i_R@1_lo"] == pytest.approx(100 * 30 / (30 + 1.96**2), abs=0.01)


def test_hand_computed_cases():
    # One query, R = 2, positives at ranks 1 and 3: R-P = 1/2, mAP@R = (1/1 + 0) / 2.
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.1]])
    positives = torch.tensor([[True, False, True, False]])
    got = multi_positive_metrics(scores, positives, ks=(1, 2, 3))
    assert got["R@1"] == 100.0 and got["R@2"] == 100.0 and got["R@3"] == 100.0
    assert got["R-P"] == pytest.approx(50.0) and got["mAP@R"] == pytest.approx(50.0)
    # R = 3, positives at ranks 1, 2, 4: R-P = 2/3, mAP@R = (1 + 1 + 0) / 3.
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5]])
    positives = torch.tensor([[True, True, False, True, False]])
    got = multi_positive_metrics(scores, positives, ks=(1,))
    assert got["R-P"] == pytest.approx(200 / 3) and got["mAP@R"] == pytest.approx(200 / 3)
    # R = 2, positives at ranks 2 and 1 after a tie (index 0 beats index 1 on a tie):
    # ranking 0, 1, 2 with positives {1, 2}: rank 1 miss, rank 2 hit -> R-P 1/2, mAP@R (0 + 1/2) / 2.
    scores = torch.tensor([[0.5, 0.5, 0.4]])
    positives = torch.tensor([[False, True, True]])
    got = multi_positive_metrics(scores, positives, ks=(1, 2))
    assert got["R@1"] == 0.0 and got["R@2"] == 100.0
    assert got["R-P"] == pytest.approx(50.0) and got["mAP@R"] == pytest.approx(25.0)
    # Two queries average: the second has every item positive (all 100).
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.1], [0.1, 0.2, 0.3, 0.4]])
    positives = torch.tensor([[True, False, True, False], [True, True, True, True]])
    got = multi_positive_metrics(scores, positives, ks=(1,))
    assert got["queries"] == 2 and got["R-P"] == pytest.approx(75.0) and got["mAP@R"] == pytest.approx(75.0)


def test_single_positive_recall_matches_recall_at_k():
    torch.manual_seed(5)
    rng = random.Random(5)
    n_images = 31
    img2txt, txt2img = random_captions(rng, n_images, 4)
    scores = (torch.randn(n_images, len(txt2img)) * 3).round()  # ties included
    expected = recall_at_k(scores, img2txt, txt2img)
    # t2i: exactly one positive image per text.
    positives = torch.zeros(n_images, len(txt2img), dtype=torch.bool)
    positives[torch.tensor(txt2img), torch.arange(len(txt2img))] = True
    got = multi_positive_metrics(scores.t(), positives.t(), chunk=8)
    for k in (1, 5, 10):
        assert got[f"R@{k}"] == pytest.approx(expected[f"t2i_R@{k}"], abs=1e-9)
    # i2t with several captions per image: R@K is still "any caption in the top K".
    got = multi_positive_metrics(scores, positives, chunk=8)
    for k in (1, 5, 10):
        assert got[f"R@{k}"] == pytest.approx(expected[f"i2t_R@{k}"], abs=1e-9)


def test_errors():
    with pytest.raises(FalconError):
        multi_positive_metrics(torch.zeros(3, 4), torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(FalconError):
        multi_positive_metrics(torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.bool))
    with pytest.raises(FalconError):
        multi_positive_metrics(torch.full((2, 2), float("nan")), torch.ones(2, 2, dtype=torch.bool))
