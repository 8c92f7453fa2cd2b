"""Recall@K against a brute-force reference on random scores."""

from __future__ import annotations

import random

import pytest
import torch

from falcon_cli.evaluation.retrieval import recall_at_k, retrieval_ranks
from tests.conftest import random_captions


def brute_force(scores, img2txt, txt2img, k):
    n_images, n_texts = scores.shape
    i2t_hits = 0
    for i in range(n_images):
        ranked = sorted(range(n_texts), key=lambda t: (-scores[i, t].item(), t))
        i2t_hits += any(t in ranked[:k] for t in img2txt[i])
    t2i_hits = 0
    for t in range(n_texts):
        ranked = sorted(range(n_images), key=lambda i: (-scores[i, t].item(), i))
        t2i_hits += txt2img[t] in ranked[:k]
    return 100 * i2t_hits / n_images, 100 * t2i_hits / n_texts


def test_recall_matches_brute_force():
    torch.manual_seed(0)
    rng = random.Random(0)
    n_images = 23
    img2txt, txt2img = random_captions(rng, n_images, 5)
    scores = torch.randn(n_images, len(txt2img))
    scores[3, img2txt[3][0]] = 10  # a guaranteed hit
    scores[:, 5] = scores[:, 6]  # ties, broken towards the lower index
    result = recall_at_k(scores, img2txt, txt2img)
    for k in (1, 5, 10):
        i2t, t2i = brute_force(scores, img2txt, txt2img, k)
        assert abs(result[f"i2t_R@{k}"] - i2t) < 1e-9 and abs(result[f"t2i_R@{k}"] - t2i) < 1e-9
    expected_mean = (sum(result[f"i2t_R@{k}"] for k in (1, 5, 10)) + sum(result[f"t2i_R@{k}"] for k in (1, 5, 10))) / 6
    assert abs(result["mean_R"] - expected_mean) < 1e-9


def sorted_ranks(scores, img2txt, txt2img, scores_t2i=None):
    """The ranks by a stable descending sort of every row (the straightforward reference)."""
    image_ranks = []
    for i, texts in enumerate(img2txt):
        order = scores[i].argsort(descending=True, stable=True).tolist()
        image_ranks.append(min((order.index(t) for t in texts), default=torch.iinfo(torch.long).max))
    scores_t = scores.t() if scores_t2i is None else scores_t2i
    text_ranks = [scores_t[t].argsort(descending=True, stable=True).tolist().index(g) for t, g in enumerate(txt2img)]
    return image_ranks, text_ranks


@pytest.mark.parametrize("seed", range(4))
def test_ranks_equal_a_stable_sort_with_many_ties(seed):
    # Scores drawn from a few values: most rows hold ties among positives and between positives and
    # negatives on both sides of them; ITM re-ranking gives t2i its own matrix; one image has no caption.
    generator = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    n_images = 17
    img2txt, txt2img = random_captions(rng, n_images, 4)
    img2txt[5] = []
    txt2img = [g if g != 5 else 4 for g in txt2img]
    n_texts = len(txt2img)
    scores = torch.randint(0, 4, (n_images, n_texts), generator=generator).float() / 3
    scores_t2i = torch.randint(0, 3, (n_texts, n_images), generator=generator).float()
    for matrix in (None, scores_t2i):
        image_ranks, text_ranks = retrieval_ranks(scores, img2txt, txt2img, matrix)
        assert (image_ranks.tolist(), text_ranks.tolist()) == sorted_ranks(scores, img2txt, txt2img, matrix)


def test_perfect_and_reversed_rankings():
    img2txt = [[0, 1], [2], [3, 4]]
    txt2img = [0, 0, 1, 2, 2]
    perfect = torch.zeros(3, 5)
    for i, caps in enumerate(img2txt):
        perfect[i, caps] = 1
    assert recall_at_k(perfect, img2txt, txt2img)["mean_R"] == 100.0
    assert recall_at_k(-perfect, img2txt, txt2img, ks=(1,))["i2t_R@1"] == 0.0


def test_ties_rank_the_lower_index_first():
    # Every score equal: image 0's caption (text 0) ranks first, image 1's (text 1) second,
    # so i2t R@1 is 50; each text ranks image 0 first, so t2i R@1 is 50 too. ALBEF's
    # np.argsort(score)[::-1] puts the later index first on rows this short: 50 and 50 the
    # other way round (image 1 and text 1 would be the hits).
    scores = torch.zeros(2, 2)
    img2txt, txt2img = [[0], [1]], [0, 1]
    image_ranks, text_ranks = retrieval_ranks(scores, img2txt, txt2img)
    assert image_ranks.tolist() == [0, 1] and text_ranks.tolist() == [0, 1]
    result = recall_at_k(scores, img2txt, txt2img, ks=(1,))
    assert result["i2t_R@1"] == 50.0 and result["t2i_R@1"] == 50.0
    # A positive tied with a higher-index negative wins; tied with a lower-index one, it loses.
    scores = torch.tensor([[0.5, 0.5, 0.1]])
    assert retrieval_ranks(scores, [[0]], [0, 0, 0])[0].tolist() == [0]
    assert retrieval_ranks(scores, [[1]], [0, 0, 0])[0].tolist() == [1]


def test_each_recall_has_its_wilson_interval():
    """R@K over n queries is a binomial proportion; the interval is Wilson's, checked against the formula written
    out and against scipy-free known values; the Markdown shows it beside the value."""
    import math

    from falcon_cli.artifacts.results import markdown_table
    from falcon_cli.evaluation.intervals import wilson_interval

    assert wilson_interval(50.0, 100) == pytest.approx((40.38, 59.62), abs=0.01)  # the textbook example
    lo, hi = wilson_interval(0.0, 20)
    assert lo == 0.0 and hi == pytest.approx(100 * 3.8415 / (20 + 3.8415), abs=0.01)
    p, n, z = 0.3, 2000, 1.959963984540054
    centre, half = (
        (p + z * z / (2 * n)) / (1 + z * z / n),
        z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n),
    )
    assert wilson_interval(30.0, 2000) == pytest.approx((100 * (centre - half), 100 * (centre + half)))
    scores = torch.eye(4)
    scores[0] = torch.tensor([0.0, 1.0, 0.0, 0.0])  # image 0 ranks caption 1 first
    metrics = recall_at_k(scores, [[0], [1], [2], [3]], [0, 1, 2, 3])
    assert metrics["i2t_R@1"] == 75.0
    assert (metrics["i2t_R@1_lo"], metrics["i2t_R@1_hi"]) == pytest.approx(wilson_interval(75.0, 4))
    table = markdown_table([{"model": "m", "i2t_R@1": 75.0, "i2t_R@1_lo": 30.06, "i2t_R@1_hi": 95.44}])
    assert "| model | i2t_R@1 |" in table and "75.00 [30.1, 95.4]" in table and "_lo" not in table


def test_perfect_recall_is_what_a_perfect_model_scores_with_true_matches_in_random_order():
    """A perfect model ranks every true match first in an order the query cannot decide: averaged over many such
    random orders, its standard R@1 (the real ``recall_at_k``) is ``perfect_recall_at_1``."""
    from falcon_cli.evaluation.multi_positive import perfect_recall_at_1

    g = torch.Generator().manual_seed(0)
    img2txt, txt2img = random_captions(random.Random(1), 12, 3)
    positives = torch.rand(12, len(txt2img), generator=g) < 0.25
    for image, texts in enumerate(img2txt):
        positives[image, texts] = True
    draws = [
        recall_at_k(positives.float() + 0.5 * torch.rand(positives.shape, generator=g), img2txt, txt2img)
        for _ in range(3000)
    ]
    perfect = perfect_recall_at_1(positives, img2txt)
    for direction in ("i2t", "t2i"):
        simulated = sum(d[f"{direction}_R@1"] for d in draws) / len(draws)
        assert simulated == pytest.approx(perfect[direction], abs=1.0)
    # By hand: one image with its caption, which also describes a second image; the second image's caption does not
    # describe the first. t2i: 1/2 and 1; i2t: the first image has one true caption (its own), the second two.
    by_hand = perfect_recall_at_1(torch.tensor([[True, False], [True, True]]), [[0], [1]])
    assert by_hand == pytest.approx({"t2i": 75.0, "i2t": 75.0})
