"""benchmarks/itm_probe.py: the fusion-only ITM harness learns where there is something to learn and only there, and
its AUC is the Mann-Whitney statistic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import itm_probe  # noqa: E402

from falcon_cli.evaluation.scoring import SplitEmbeddings  # noqa: E402
from falcon_cli.models.bert import FusionEncoder, init_bert_weights  # noqa: E402
from falcon_cli.models.config import AlbefConfig  # noqa: E402


def synthetic_split(
    images: int, classes: int, *, linked: bool, seed: int = 0
) -> tuple[SplitEmbeddings, list[list[int]]]:
    """Each image shows one of ``classes`` (its tokens carry the class's vector plus noise) and has two captions whose
    tokens carry the class too (``linked``) or another, unrelated class (nothing links a caption to its image).
    ITC features: the class one-hot with noise, so the ITC-hardest other image usually shares the class."""
    g = torch.Generator().manual_seed(seed)
    width, tokens, length = 16, 5, 4
    label = torch.randint(classes, (images,), generator=g)
    caption_label = label.repeat_interleave(2) if linked else torch.randint(classes, (2 * images,), generator=g)
    image_codes, text_codes = torch.randn(classes, width, generator=g), torch.randn(classes, width, generator=g)
    image_tokens = image_codes[label][:, None] + 0.3 * torch.randn(images, tokens, width, generator=g)
    text_tokens = text_codes[caption_label][:, None] + 0.3 * torch.randn(2 * images, length, width, generator=g)

    def onehot(y):
        return torch.nn.functional.normalize(
            torch.eye(classes)[y] + 0.1 * torch.randn(len(y), classes, generator=g), dim=-1
        )

    e = SplitEmbeddings(
        image_tokens,
        onehot(label),
        text_tokens,
        torch.ones(2 * images, length, dtype=torch.long),
        onehot(caption_label),
    )
    return e, [[2 * i, 2 * i + 1] for i in range(images)]


def fusion_and_head(seed: int = 0):
    torch.manual_seed(seed)
    config = AlbefConfig(
        vision_width=16,
        vision_heads=2,
        text_width=16,
        text_heads=2,
        fusion_layers=1,
        intermediate_size=32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    fusion = FusionEncoder(config)
    init_bert_weights(fusion)
    return fusion, torch.nn.Linear(16, 2)


def train_on_synthetic(linked: bool, negatives: str) -> tuple[list[dict], dict]:
    """300 steps of the harness on :func:`synthetic_split` (180 training images, 60 held out): the curve, and the
    held-out pairs."""
    e, img2txt = synthetic_split(240, 6, linked=linked)
    fusion, head = fusion_and_head()
    held_out = itm_probe.probe_pairs(e.similarity(), img2txt, torch.arange(180, 240), torch.Generator().manual_seed(0))
    curve = itm_probe.train_fusion(
        fusion,
        head,
        e,
        img2txt,
        torch.arange(180),
        held_out,
        steps=300,
        lr=3e-3,
        batch=32,
        negatives=negatives,
        log=lambda line: None,
    )
    return curve, held_out


def test_the_harness_learns_matching_when_captions_carry_their_image():
    curve, _ = train_on_synthetic(linked=True, negatives="random")
    assert curve[0]["itm_auc_random"] == pytest.approx(0.5, abs=0.15)  # nothing learned yet
    assert curve[-1]["itm_auc_random"] > 0.8  # a random other image usually shows another class
    assert curve[-1]["loss"] < itm_probe.ITM_PRIOR - 0.1
    assert [p["step"] for p in curve] == [0, 37, 74, 111, 148, 185, 222, 259, 296, 300]


def test_hardest_negatives_that_are_matches_teach_nothing_even_against_random_images():
    """The ITC's hardest other image shares the caption's class here: every mined negative looks exactly like a
    positive, so the best the head can do is the prior, and it learns nothing it could use on easy pairs either."""
    curve, held_out = train_on_synthetic(linked=True, negatives="hardest")
    assert held_out["hardest"].tolist() != held_out["random"].tolist()
    assert curve[-1]["itm_auc_random"] < 0.7
    assert curve[-1]["loss"] > itm_probe.ITM_PRIOR - 0.05


def test_the_harness_learns_nothing_when_captions_are_unrelated_to_their_image():
    curve, _ = train_on_synthetic(linked=False, negatives="random")
    assert curve[-1]["itm_auc_random"] == pytest.approx(0.5, abs=0.15)
    assert curve[-1]["loss"] > itm_probe.ITM_PRIOR - 0.05  # the best it can do is the prior


def test_probe_pairs_take_the_first_caption_a_random_other_image_and_the_itc_hardest_one():
    similarity = torch.tensor(
        [[0.9, 0.1, 0.2, 0.0, 0.5, 0.0], [0.8, 0.0, 0.9, 0.0, 0.1, 0.0], [0.1, 0.0, 0.3, 0.0, 0.7, 0.0]]
    )  # [images, texts]: image i's captions 2i, 2i + 1
    pairs = itm_probe.probe_pairs(
        similarity, [[0, 1], [2, 3], [4, 5]], torch.arange(3), torch.Generator().manual_seed(0)
    )
    assert pairs["text"].tolist() == [0, 2, 4]
    assert pairs["hardest"].tolist() == [
        1,
        2,
        0,
    ]  # caption 0: image 1 (0.8 > 0.1); caption 2: image 2 (0.3 > 0.2); caption 4: image 0
    assert (pairs["random"] != pairs["image"]).all()


def test_auc_is_the_mann_whitney_statistic_with_ties_half():
    positive, negative = torch.tensor([0.9, 0.5, 0.5]), torch.tensor([0.5, 0.1])
    expected = sum((p > n) + 0.5 * (p == n) for p in positive.tolist() for n in negative.tolist()) / 6
    assert itm_probe.auc(positive, negative) == pytest.approx(expected)
    assert itm_probe.auc(torch.tensor([1.0]), torch.tensor([0.0])) == 1.0


def test_wins_compare_each_caption_with_its_own_other_image_only():
    own, other = torch.tensor([0.9, 0.2, 0.5, 0.1]), torch.tensor([0.1, 0.3, 0.5, 0.0])
    assert itm_probe.wins(own, other) == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    # a head right on every query but scaled differently per query: a re-ranking is perfect, the pooled AUC is not
    own, other = torch.tensor([0.9, 0.3]), torch.tensor([0.8, 0.2])
    assert itm_probe.wins(own, other) == 1.0 and itm_probe.auc(own, other) == pytest.approx(0.75)
