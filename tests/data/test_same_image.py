"""``pretrain.false_negatives.same_image: mask``: pairs that show the same image leave the ITC denominators and ITM
mining."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from falcon_cli.data.pretrain import PretrainRecord
from falcon_cli.data.shared_images import SharedImages, image_keys
from falcon_cli.objectives.itc import itc_grit
from falcon_cli.objectives.itm import hardest_negatives, sample_negatives


def reference_itc(v, t, tau, weight, exclude):
    """GRIT's ITC written row by row over each anchor's kept entries (the diagonal always kept)."""
    n = len(v)
    sim_i2t, sim_t2i = v @ t.T / tau, t @ v.T / tau
    kept_i2t = [[j for j in range(n) if j == i or not exclude[i, j]] for i in range(n)]
    kept_t2i = [[j for j in range(n) if j == i or not exclude[j, i]] for i in range(n)]

    def probs(sim, kept):
        p = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            p[i, kept[i]] = F.softmax(sim[i, kept[i]], dim=0)
        return p

    p_i2t, p_t2i = probs(sim_i2t, kept_i2t), probs(sim_t2i, kept_t2i)
    hard = soft = 0.0
    for i in range(n):
        hard += -torch.log(p_i2t[i, i]) - torch.log(p_t2i[i, i])
        q_i2t = p_t2i[i, kept_i2t[i]] / p_t2i[i, kept_i2t[i]].sum()  # targets restricted to the kept set
        q_t2i = p_i2t[i, kept_t2i[i]] / p_i2t[i, kept_t2i[i]].sum()
        soft += -(q_i2t * torch.log(p_i2t[i, kept_i2t[i]])).sum() - (q_t2i * torch.log(p_t2i[i, kept_t2i[i]])).sum()
    hard, soft = hard / (2 * n), soft / (2 * n)
    return hard + weight * soft, hard, soft


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_excluded_itc_matches_the_row_by_row_reference(seed):
    g = torch.Generator().manual_seed(seed)
    n, d = 7, 5
    v = F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    t = F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    exclude = torch.rand(n, n, generator=g) < 0.3
    exclude[0, :] = True  # an anchor left with only its own pair
    out = itc_grit(v, t, 0.07, consistency_weight=0.2, exclude=exclude)
    loss, hard, soft = reference_itc(v, t, 0.07, 0.2, exclude)
    assert out.loss.item() == pytest.approx(loss.item(), rel=1e-5)
    assert out.hard.item() == pytest.approx(hard.item(), rel=1e-5)
    assert out.soft.item() == pytest.approx(soft.item(), rel=1e-5)
    assert torch.isfinite(out.loss)


def test_nothing_excluded_is_plain_grit_and_gradients_skip_removed_entries():
    g = torch.Generator().manual_seed(3)
    v = F.normalize(torch.randn(6, 4, generator=g), dim=1).requires_grad_()
    t = F.normalize(torch.randn(6, 4, generator=g), dim=1)
    plain = itc_grit(v, t, 0.1)
    none = itc_grit(v, t, 0.1, exclude=torch.zeros(6, 6, dtype=torch.bool))
    assert none.loss.item() == pytest.approx(plain.loss.item(), abs=1e-6)
    # A text removed from every image's softmax no longer pushes any image: the gradient of the
    # i2t loss with respect to the images does not depend on it.
    exclude = torch.zeros(6, 6, dtype=torch.bool)
    exclude[:, 5] = True
    a = itc_grit(v, t, 0.1, consistency_weight=0.0, exclude=exclude, exclude_t2i=torch.zeros(6, 6, dtype=torch.bool))
    (grad_a,) = torch.autograd.grad(a.loss, v)
    t2 = t.clone()
    t2[5] = F.normalize(torch.randn(4, generator=g), dim=0)
    b = itc_grit(v, t2, 0.1, consistency_weight=0.0, exclude=exclude, exclude_t2i=torch.zeros(6, 6, dtype=torch.bool))
    (grad_b,) = torch.autograd.grad(b.loss, v)
    assert torch.allclose(grad_a[:5], grad_b[:5], atol=1e-6)


def records(images: list[str], image_ids: list | None = None) -> list[PretrainRecord]:
    return [
        PretrainRecord(
            pair_id=10 + i,
            image=Path(path),
            captions=(f"caption {i}",),
            extra={} if image_ids is None else {"image_id": image_ids[i]},
        )
        for i, path in enumerate(images)
    ]


def test_shared_images_by_image_id_or_else_by_path():
    by_path = SharedImages(records(["a.jpg", "b.jpg", "a.jpg", "c.jpg"]))
    mask = by_path.mask(torch.tensor([12, 10, 11, 13]))
    assert mask.tolist() == [
        [False, True, False, False],
        [True, False, False, False],
        [False, False, False, False],
        [False, False, False, False],
    ]
    # image_id wins when every entry has one (two files of one COCO image, e.g. copies in two folders)
    by_id = SharedImages(records(["x/a.jpg", "y/a.jpg", "b.jpg"], image_ids=[7, 7, 8]))
    assert by_id.mask(torch.tensor([10, 11, 12]))[0, 1]
    assert image_keys(records(["a.jpg", "b.jpg"], image_ids=[1, None]))[0] == ("path", "a.jpg")
    with pytest.raises(KeyError, match="pair_id 99"):
        by_path.mask(torch.tensor([10, 99]))


def test_itm_mining_never_picks_a_pair_of_the_same_image():
    sim = torch.tensor([[5.0, 4.0, 1.0], [4.0, 5.0, 2.0], [1.0, 2.0, 5.0]])
    same = torch.tensor([[False, True, False], [True, False, False], [False, False, False]])
    assert hardest_negatives(sim, sim.T)[0].tolist() == [1, 0, 1]
    assert hardest_negatives(sim, sim.T, positive_mask=same)[0].tolist() == [2, 2, 1]
    draws = sample_negatives(sim, sim.T, torch.Generator().manual_seed(0), positive_mask=same)
    assert draws[0][:2].tolist() == [2, 2] and draws[1][:2].tolist() == [2, 2]


def test_vlp_objective_masks_same_image_pairs_in_itc_and_itm():
    from falcon_cli.models.registry import create_model
    from falcon_cli.objectives.false_negatives import StepContext
    from falcon_cli.objectives.mlm import MlmMask
    from falcon_cli.objectives.vlp import VlpObjective

    torch.manual_seed(0)
    model = create_model("albef-tiny", vocab_size=60, image_size=32)
    objective = VlpObjective(model)
    images = torch.randn(4, 3, 32, 32)
    images[1] = images[0]  # pairs 0 and 1 show the same image
    ids = torch.randint(5, 60, (4, 8))
    ids[:, 0] = 2
    attention = torch.ones_like(ids)
    mask = MlmMask.sample(
        ids,
        attention,
        probability=0.15,
        generator=torch.Generator().manual_seed(0),
        vocab_size=60,
        mask_token_id=4,
        pad_token_id=0,
        cls_token_id=2,
    )
    same = torch.zeros(4, 4, dtype=torch.bool)
    same[0, 1] = same[1, 0] = True
    objective.eval()
    with torch.no_grad():
        plain = objective(images, ids, attention, mask, context=StepContext(torch.arange(4)))
        masked = objective(images, ids, attention, mask, context=StepContext(torch.arange(4), same_image=same))
        measured = objective.measure(images, ids, attention, mask, parts=("itc", "itm"), same_image=same)
    itc = itc_grit(plain.image_feat, plain.text_feat, plain.temperature, exclude=same)
    assert masked.itc.item() == pytest.approx(itc.loss.item(), rel=1e-5)
    assert masked.itc.item() != pytest.approx(plain.itc.item(), rel=1e-6)
    assert measured["itc"].item() == pytest.approx(masked.itc.item(), rel=1e-5)
    assert measured["itm"].item() == pytest.approx(masked.itm.item(), rel=1e-5)
    assert masked.itm.item() != pytest.approx(plain.itm.item(), rel=1e-6)  # (the hardest negative of 0 was 1)
    # `oracle_negatives: mask_itc`: the ITC masked, ITM's mining as without the mask
    with torch.no_grad():
        itc_only = objective(
            images, ids, attention, mask, context=StepContext(torch.arange(4), same_image=same, mask_itm=False)
        )
    assert itc_only.itc.item() == pytest.approx(masked.itc.item(), rel=1e-5)
    assert itc_only.itm.item() == pytest.approx(plain.itm.item(), rel=1e-5)


def test_config_refuses_mask_where_it_does_not_apply():
    from falcon_cli.config.recipes import load_recipe
    from falcon_cli.errors import FalconError

    assert (
        load_recipe("shapes-grit", ["pretrain.false_negatives.same_image=mask"])[0].pretrain.false_negatives.same_image
        == "mask"
    )
    assert (
        load_recipe("shapes-glofnd", ["pretrain.false_negatives.same_image=mask"])[
            0
        ].pretrain.false_negatives.same_image
        == "mask"
    )
    for recipe in ("shapes-mafa", "shapes-srcl", "shapes-diht"):
        with pytest.raises(FalconError, match="same_image=mask works with method none or glofnd"):
            load_recipe(recipe, ["pretrain.false_negatives.same_image=mask"])
    with pytest.raises(FalconError, match="expected one of negative or mask"):
        load_recipe("shapes-grit", ["pretrain.false_negatives.same_image=drop"])


def test_masked_run_and_its_audit(tmp_path):
    """A FALCON run with `same_image: mask` (epoch 0 uniform, epoch 1 FALCON with the ITC+ITM reward measured in
    eval mode, where the mask also applies) logs how many entries it masked; its audit re-mines ITM negatives
    with the mask (so none shares its image) and reports the same-image share of the false negatives."""
    import json

    from falcon_cli.runtime.metrics import read_metrics
    from tests.conftest import run_cli

    run = tmp_path / "run"
    proc = run_cli(
        "pretrain",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        run,
        f"data.dataset={tmp_path / 'world'}",
        "data.shapes.images=40",
        "data.tokenizer_vocab_size=200",
        "pretrain.epochs=2",
        "pretrain.batch_size=16",
        "pretrain.composer.search_space_size=48",
        "pretrain.loader.num_workers=0",
        "pretrain.optim.warmup_steps=2",
        "pretrain.logging.every=1",
        "pretrain.eval.split=null",
        "pretrain.false_negatives.same_image=mask",
        "pretrain.composer.name=falcon",
        "pretrain.scheduler.reward.name=itc+itm",
        "pretrain.scheduler.reward.mode=eval",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    masked = [r["same_image_masked"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert len(masked) == 20 and sum(masked) > 0 and all(m % 2 == 0 for m in masked)  # symmetric pairs
    rewards = [r["reward"] for r in read_metrics(run / "metrics.jsonl") if r.get("sampler") == "falcon"]
    assert len(rewards) == 10 and all(r == r for r in rewards)
    proc = run_cli("audit-false-negatives", run, "--judge", "oracle")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    overall = {r["kind"]: r for r in json.loads((run / "audit" / "summary.json").read_text())["overall"]}
    assert overall["itm"]["same_image"] == 0
    assert overall["all"]["same_image"] == overall["all"]["same_image_false_negatives"]  # false by construction
    assert "same_image_share" in (run / "audit" / "audit.md").read_text()
