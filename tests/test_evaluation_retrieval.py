"""Recall@K against a brute-force reference on random scores."""

from __future__ import annotations

import random

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
