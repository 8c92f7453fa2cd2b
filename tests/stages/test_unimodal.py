"""The unimodal stage: the shapes world's DeiT and BERT, cached per world, model and seed, and loaded by pretraining;
and the learning curve (`pretrain.eval.every`) of a run that starts from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import run_cli

TINY = [
    "data.shapes.images=40",
    "data.shapes.size=24",
    "pretrain.encoders.image_size=24",
    "data.tokenizer_vocab_size=200",
    "data.verify_images=false",
    "unimodal.image_epochs=2",
    "unimodal.text_epochs=1",
    "unimodal.batch_size=8",
    "pretrain.encoders.vision_weights=unimodal",
    "pretrain.encoders.text_weights=unimodal",
    "pretrain.epochs=2",
    "pretrain.max_steps_per_epoch=2",
    "pretrain.batch_size=8",
    "pretrain.loader.num_workers=0",
    "pretrain.loader.augment=test",
    "pretrain.optim.warmup_steps=1",
    "pretrain.eval.every=1",
    "pretrain.runtime.device=cpu",
    "unimodal.device=cpu",
]


def ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """data → unimodal → pretrain on a world shared through data.dataset."""
    root = tmp_path_factory.mktemp("unimodal")
    ok(
        run_cli(
            "run",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            root / "a",
            f"data.dataset={root / 'world'}",
            "stages=[data, unimodal, pretrain]",
            *TINY,
        )
    )
    return root


def entries(world):
    return sorted(p for p in (world / "unimodal").iterdir() if not p.name.startswith("."))


def test_the_stage_trains_both_encoders_and_pretraining_starts_from_them(first):
    (entry,) = entries(first / "world")
    report = json.loads((entry / "report.json").read_text())
    assert report["image"]["steps"] == 2 * (32 // 8) and report["text"]["steps"] == 1 * (160 // 8)  # 32 train images
    for key in ("val_shape_accuracy", "val_color_accuracy", "val_size_accuracy", "val_empty_cells"):
        assert 0 <= report["image"][key] <= 100
    assert report["text"]["val_masked_tokens"] > 0
    vision = load_file(str(entry / "vision.safetensors"))
    assert "pos_embed" in vision and not any(k.startswith("head") for k in vision)  # the bare ViT, timm's names
    assert json.loads((entry / "text" / "config.json").read_text())["num_hidden_layers"] == 4  # text 2 + fusion 2
    log = (first / "a" / "log.txt").read_text()
    assert f"vision weights from {entry / 'vision.safetensors'}: loaded" in log
    assert f"text weights from {entry / 'text'}: loaded" in log
    manifest = json.loads((first / "a" / "manifest.json").read_text())
    assert manifest["stages"]["unimodal"]["result"]["reused"] is False
    assert manifest["config"]["pretrain"]["encoders"]["vision_weights"] == "unimodal"  # the keyword stays on record
    row = json.loads((first / "a" / "results" / "unimodal.json").read_text())["rows"][0]
    assert row["weights"] == str(entry) and row["reused"] is False


def test_the_learning_curve_has_a_point_per_epoch_and_ends_at_the_final_result(first):
    """`pretrain.eval.every: 1`: zero-shot retrieval after every epoch, in metrics.jsonl (kind zero_shot)."""
    from falcon_cli.runtime.metrics import read_metrics

    curve = [r for r in read_metrics(first / "a" / "metrics.jsonl") if r.get("kind") == "zero_shot"]
    assert [r["epoch"] for r in curve] == [0, 1]
    final = next(
        r
        for r in json.loads((first / "a" / "results" / "retrieval_zeroshot.json").read_text())["rows"]
        if r["model"] == "trained"
    )
    for key in ("i2t_R@1", "t2i_R@5", "mean_R", "i2t_R@1_lo", "oracle_i2t_R@1", "oracle_t2i_R@1_hi"):
        assert curve[-1][key] == pytest.approx(final[key])
    for point in curve:  # (a shapes world: every true match counts too, so those recalls can only be higher)
        assert point["oracle_i2t_R@1"] >= point["i2t_R@1"] and point["oracle_t2i_R@1"] >= point["t2i_R@1"]


def test_another_run_of_the_same_world_and_seed_reuses_them_and_another_seed_does_not(first):
    (entry,) = entries(first / "world")
    before = (entry / "vision.safetensors").stat().st_mtime_ns
    ok(
        run_cli(
            "unimodal", "--recipe", "shapes-demo", "--run-dir", first / "b", f"data.dataset={first / 'world'}", *TINY
        )
    )
    assert json.loads((first / "b" / "results" / "unimodal.json").read_text())["rows"][0]["reused"] is True
    assert (entry / "vision.safetensors").stat().st_mtime_ns == before
    ok(
        run_cli(
            "unimodal",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            first / "c",
            f"data.dataset={first / 'world'}",
            *TINY,
            "seed=1",
        )
    )
    assert len(entries(first / "world")) == 2


def test_pretraining_from_unimodal_weights_that_do_not_exist_is_one_line(first):
    proc = run_cli(
        "pretrain",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        first / "d",
        f"data.dataset={first / 'world'}",
        *TINY,
        "unimodal.text_epochs=3",
    )
    assert proc.returncode != 0
    assert (
        "holds no unimodal weights for this world, model and seed" in proc.stderr and "falcon unimodal" in proc.stderr
    )
    last = proc.stderr.strip().splitlines()[-1]  # (after the data stage's own report)
    assert last.startswith("error: pretrain: vision_weights/text_weights=unimodal") and "Traceback" not in proc.stderr


def test_unimodal_weights_are_for_albef_models_only():
    proc = run_cli("recipes", "show", "shapes-siglip", "pretrain.encoders.vision_weights=unimodal")
    assert proc.returncode != 0 and "unimodal stage trains ALBEF's encoders" in proc.stderr


@pytest.mark.parametrize("image_size,patch_size", [(32, 8), (48, 8), (24, 8), (16, 8), (64, 16)])
def test_cell_pooling_weighs_each_patch_by_the_pixels_it_shares_with_the_cell(image_size, patch_size):
    """Against counting pixels: the share of a cell's pixels that fall in each patch (cells and patches need not
    line up; a cell smaller than a patch still gets the patches it overlaps)."""
    import torch

    from falcon_cli.models.unimodal import cell_pooling

    # Each pixel's cell and patch, on a 3x finer grid so that cell borders at thirds fall between subpixels.
    fine = 3 * image_size
    axis = torch.arange(fine)
    cell = (axis * 3) // fine  # (pixel + k/3) lies in cell floor(3 * (pixel + k/3) / size)
    patch = axis // (3 * patch_size)
    grid = image_size // patch_size
    cells = (cell[:, None] * 3 + cell[None, :]).flatten()
    patches = (patch[:, None] * grid + patch[None, :]).flatten()
    counts = torch.zeros(9, grid * grid, dtype=torch.float64)
    counts.index_put_((cells, patches), torch.ones(len(cells), dtype=torch.float64), accumulate=True)
    expected = counts / counts.sum(dim=1, keepdim=True)
    got = cell_pooling(image_size, patch_size)
    assert got.shape == (9, grid * grid)
    assert torch.allclose(got.double(), expected, atol=1e-6)


def test_where_cells_line_up_with_patches_each_cell_pools_exactly_its_own():
    """At 48 px with 8 px patches a cell is 2x2 patches: it takes those four, a quarter each, and nothing else."""
    import torch

    from falcon_cli.models.unimodal import cell_pooling

    pool = cell_pooling(48, 8)  # cells line up with 2x2 patches at 48 px
    assert ((pool > 0).sum(dim=1) == 4).all()
    top_left = pool[0].view(6, 6)
    assert (
        torch.allclose(top_left[:2, :2], torch.full((2, 2), 0.25))
        and top_left[2:].sum() == 0
        and top_left[:, 2:].sum() == 0
    )


def test_extra_images_and_a_shared_unimodal_seed(first):
    """`unimodal.extra_images` adds fresh scenes to the image encoder's training set; `unimodal.seed` makes runs of
    other seeds share one entry."""
    extra = [*TINY, "unimodal.extra_images=24", "unimodal.seed=5"]
    ok(
        run_cli(
            "unimodal", "--recipe", "shapes-demo", "--run-dir", first / "e", f"data.dataset={first / 'world'}", *extra
        )
    )
    report = json.loads((first / "e" / "results" / "unimodal.json").read_text())
    row = report["rows"][0]
    assert row["reused"] is False and row["image_train_images"] == 32 + 24 and row["image_extra_images"] == 24
    assert 0 <= row["image_val_shape_accuracy_occupied"] <= 100
    ok(
        run_cli(
            "unimodal",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            first / "f",
            f"data.dataset={first / 'world'}",
            *extra,
            "seed=2",
        )
    )
    again = json.loads((first / "f" / "results" / "unimodal.json").read_text())
    assert again["rows"][0]["reused"] is True and again["rows"][0]["weights"] == row["weights"]
    assert report["meta"]["seed"] == again["meta"]["seed"] == 5


def _fit_linear(grad_clip, scale=1e3):
    """Two steps of `_fit` on a linear model whose loss gradient has norm about ``scale``."""
    import torch

    from stages.unimodal import _fit

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x = torch.randn(16, 4)

    def step(batch):
        return scale * model(batch).pow(2).mean(), {}

    before = [p.detach().clone() for p in model.parameters()]
    report = _fit(model, 1, 8, 1.0, 0.0, grad_clip, 0, train=(x,), step=step, what="test")
    return report, before, list(model.parameters())


def test_fit_clips_the_gradient_norm_and_reports_how_often():
    """`unimodal.grad_clip`: every step of a loss with a huge gradient is clipped (and counted); without it none is,
    and the norm before clipping is reported either way."""
    import torch

    clipped, _, _ = _fit_linear(1.0)
    free, _, _ = _fit_linear(None)
    assert clipped["steps"] == free["steps"] == 2
    assert clipped["clipped_steps"] == 2 and free["clipped_steps"] == 0
    assert clipped["max_grad_norm"] > 100 and free["max_grad_norm"] > 100
    gentle, _, _ = _fit_linear(1e6)  # a limit above every norm clips nothing
    assert gentle["clipped_steps"] == 0 and gentle["max_grad_norm"] == pytest.approx(free["max_grad_norm"])
    # Clipping changes what AdamW sees: the second step's update differs from the unclipped run's.
    _, before, after_clipped = _fit_linear(1.0)
    _, _, after_free = _fit_linear(None)
    assert not all(torch.allclose(a, b) for a, b in zip(after_clipped, after_free))
    assert not all(torch.allclose(a, b) for a, b in zip(after_clipped, before))


def test_the_clip_is_a_setting_of_the_cache_entry(first):
    """Encoders trained with another `unimodal.grad_clip` are another entry; the report records the clipping."""
    ok(
        run_cli(
            "unimodal",
            "--recipe",
            "shapes-demo",
            "--run-dir",
            first / "g",
            f"data.dataset={first / 'world'}",
            *TINY,
            "unimodal.grad_clip=null",
        )
    )
    row = json.loads((first / "g" / "results" / "unimodal.json").read_text())["rows"][0]
    assert row["reused"] is False and row["image_clipped_steps"] == 0 and row["image_max_grad_norm"] > 0
    default = json.loads((first / "a" / "results" / "unimodal.json").read_text())["rows"][0]
    assert default["weights"] != row["weights"] and "image_clipped_steps" in default
    report = json.loads((Path(row["weights"]) / "report.json").read_text())
    assert report["settings"]["grad_clip"] is None
