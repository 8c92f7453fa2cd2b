"""candidate_risk against a loop over anchors: the truth of the hardest, 10th and median candidate of each
anchor's search space, and the mean over all its candidates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from falcon_cli.audit.candidates import RANKS, candidate_risk


def reference(image_feat, text_feat, image_ids, truth, space_size, seed):
    order = torch.randperm(len(image_ids), generator=torch.Generator().manual_seed(seed)).numpy()
    out = {d: {r: [] for r in RANKS} for d in ("t2i", "i2t")}
    for start in range(0, len(order), space_size):
        rows = order[start : start + space_size]
        distinct = []
        for r in rows:  # the first pair of each image in the space
            if image_ids[r] not in [image_ids[d] for d in distinct]:
                distinct.append(r)
        if len(distinct) < 2:
            continue
        sim = image_feat.float().numpy() @ text_feat.float().numpy().T
        anchors = [
            ("t2i", c, [(sim[i, c], truth[i, c]) for i in distinct if image_ids[i] != image_ids[c]]) for c in rows
        ]
        anchors += [
            ("i2t", i, [(sim[i, c], truth[i, c]) for c in rows if image_ids[c] != image_ids[i]]) for i in distinct
        ]
        for direction, _, candidates in anchors:
            ranked = [t for _, t in sorted(candidates, key=lambda st: -st[0])]  # (ties: none with random features)
            for rank, k in (("top-1", 0), ("top-10", 9), ("median", (len(ranked) - 1) // 2)):
                if k < len(ranked):
                    out[direction][rank].append(float(ranked[k]))
            if ranked:
                out[direction]["random"].append(float(np.mean(ranked)))
    return out


@pytest.mark.parametrize("space_size", [7, 16, 64])
def test_candidate_risk_matches_a_loop_over_anchors(space_size):
    gen = torch.Generator().manual_seed(0)
    images = 20
    image_ids = np.repeat(np.arange(images), 3)[torch.randperm(60, generator=gen).numpy()]  # 3 captions an image
    image_feat = torch.randn(images, 8, generator=gen)[image_ids]
    text_feat = torch.randn(60, 8, generator=gen)
    truth_by_image = torch.rand(images, 60, generator=gen).numpy() < 0.3
    truth_by_image[image_ids, np.arange(60)] = True
    truth = truth_by_image[image_ids]  # rows of a shared image are equal
    got = candidate_risk(
        image_feat, text_feat, image_ids, lambda rows: truth[rows][:, rows], space_size=space_size, seed=3
    )
    want = reference(image_feat, text_feat, image_ids, truth, space_size, 3)
    for direction in ("t2i", "i2t", "both"):
        for rank in RANKS:
            values = want["t2i"][rank] + want["i2t"][rank] if direction == "both" else want[direction][rank]
            assert got[direction][f"anchors_{rank}"] == len(values)
            if values:
                assert got[direction][rank] == pytest.approx(np.mean(values))


def test_hard_candidates_that_are_true_matches_show_as_rising_risk():
    """A model whose most similar candidates are the true ones (the premise): top-1 far riskier than random."""
    gen = torch.Generator().manual_seed(1)
    groups = torch.arange(40) % 4  # 4 kinds of scene; a caption fits its kind
    truth = (groups[:, None] == groups[None, :]).numpy()
    image_feat = torch.nn.functional.one_hot(groups, 4).float() + 0.1 * torch.randn(40, 4, generator=gen)
    text_feat = torch.nn.functional.one_hot(groups, 4).float() + 0.1 * torch.randn(40, 4, generator=gen)
    risk = candidate_risk(image_feat, text_feat, np.arange(40), lambda rows: truth[rows][:, rows], space_size=40)[
        "both"
    ]
    assert risk["top-1"] == 1.0 and risk["random"] == pytest.approx(9 / 39) and risk["median"] == 0.0
