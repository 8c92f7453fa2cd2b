"""`falcon compare`: the interval arithmetic against plain references, and the command on runs a real tiny run's
results stand in for (their numbers set per method and seed, so every interval is known)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from falcon_cli.evaluation.intervals import mean_interval, paired_difference, t_cdf, t_quantile
from tests.conftest import assert_png, run_cli

# Student's t, 97.5% quantiles, as printed in statistics tables (three decimals).
T_TABLE = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
    math.inf: 1.960,
}


def test_t_quantiles_match_the_printed_table():
    for df, expected in T_TABLE.items():
        assert t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4), df


def test_t_quantiles_match_closed_forms_and_a_plain_integration():
    for p in (0.6, 0.9, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)  # Cauchy
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
        assert t_quantile(1 - p, 7) == pytest.approx(-t_quantile(p, 7), rel=1e-12)

    def density(x, df):
        return (
            math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2))
            / math.sqrt(df * math.pi)
            * (1 + x * x / df) ** (-(df + 1) / 2)
        )

    def cdf(t, df, steps=1000):  # Simpson's rule from 0 to t, plus the half below 0
        h = t / steps
        total = density(0, df) + density(t, df) + sum((4 if i % 2 else 2) * density(i * h, df) for i in range(1, steps))
        return 0.5 + total * h / 3

    for df in (3, 4, 8, 13):
        for p in (0.9, 0.975):
            lo, hi = 0.0, 20.0
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if cdf(mid, df) < p else (lo, mid)
            assert t_quantile(p, df) == pytest.approx((lo + hi) / 2, abs=1e-6), (df, p)
            assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)


def test_mean_and_paired_intervals_against_the_formula():
    a, b = [64.4, 63.5, 73.7, 69.3, 74.5], [68.1, 66.2, 66.6, 65.0, 67.6]
    diff = [x - y for x, y in zip(a, b)]
    mean = sum(diff) / 5
    std = math.sqrt(sum((d - mean) ** 2 for d in diff) / 4)
    half = 2.7764451051977987 * std / math.sqrt(5)
    d = paired_difference(a, b)
    assert (d.n, d.positive, d.negative) == (5, 3, 2)
    assert d.mean == pytest.approx(mean, abs=1e-12) and d.std == pytest.approx(std, abs=1e-12)
    assert (d.lo, d.hi) == pytest.approx((mean - half, mean + half), abs=1e-9)
    assert d.t == pytest.approx(mean / (std / math.sqrt(5)))
    assert d.verdict == ("higher" if mean - half > 0 else "no difference")
    assert paired_difference([2, 2.2, 2.4], [0, 0, 0]).verdict == "higher"
    assert paired_difference([1, 2, 3], [0, 0, 0]).verdict == "no difference"  # (t(2) = 4.30: the interval holds 0)
    assert paired_difference([0, 0.1, 0], [1, 1, 1.1]).verdict == "lower"
    assert paired_difference([1], [0]).verdict == "one seed: no verdict"
    single = mean_interval([3.0])
    assert single.n == 1 and math.isnan(single.lo) and math.isnan(single.std)


# --- the command ----------------------------------------------------------------------------------------------------

TINY = [
    "data.shapes.images=40",
    "data.shapes.size=32",
    "pretrain.encoders.image_size=32",
    "data.tokenizer_vocab_size=200",
    "pretrain.epochs=1",
    "pretrain.batch_size=16",
    "pretrain.max_steps_per_epoch=2",
    "pretrain.loader.num_workers=0",
    "pretrain.optim.warmup_steps=1",
    "stages=[data, pretrain, evaluate]",
    "evaluate.tasks=[retrieval]",
    "evaluate.num_workers=0",
    "evaluate.retrieval.k=4",
    "evaluate.batch_size=16",
]

# (method, seed) -> (i2t R@1, t2i R@1) of the re-ranked row; the ITC row gets these minus 10
VALUES = {
    ("uniform", 0): (60.0, 50.0),
    ("uniform", 1): (62.0, 51.0),
    ("uniform", 2): (58.0, 49.0),
    ("grit", 0): (64.0, 52.0),
    ("grit", 1): (65.0, 52.5),
    ("grit", 2): (61.0, 50.0),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """One real tiny run: data, one epoch of GRIT pretraining, retrieval evaluated by ITC and re-ranked by ITM."""
    root = tmp_path_factory.mktemp("compare-source")
    run = root / "run"
    proc = run_cli("run", "--recipe", "shapes-demo", "--run-dir", run, f"data.dataset={root / 'world'}", *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run


def make_run(source: Path, target: Path, method: str, seed: int, values: tuple[float, float] | None = None) -> Path:
    """A copy of ``source``'s manifest and results as ``method`` (grit: the recipe's composer; uniform: composer
    uniform) and ``seed``, its R@1 set to ``values``."""
    target.mkdir(parents=True)
    shutil.copytree(source / "results", target / "results")
    manifest = json.loads((source / "manifest.json").read_text())
    manifest["seed"] = manifest["config"]["seed"] = seed
    manifest["config"]["pretrain"]["composer"]["name"] = method
    (target / "manifest.json").write_text(json.dumps(manifest))
    if values is not None:
        path = target / "results" / "retrieval.json"
        result = json.loads(path.read_text())
        for row in result["rows"]:
            shift = 10.0 if row["scoring"] == "itc" else 0.0
            row["i2t_R@1"], row["t2i_R@1"] = values[0] - shift, values[1] - shift
        path.write_text(json.dumps(result))
    return target


@pytest.fixture
def runs(source, tmp_path):
    for (method, seed), values in VALUES.items():
        make_run(source, tmp_path / "runs" / f"{method}-s{seed}", method, seed, values)
    return tmp_path


def test_compare_pairs_seeds_and_matches_the_reference(runs):
    proc = run_cli(
        "compare",
        "runs/uniform-s0",
        "runs/uniform-s1",
        "runs/uniform-s2",
        "runs/grit-s0",
        "runs/grit-s1",
        "runs/grit-s2",
        "--metric",
        "rerank:R@1",
        "--metric",
        "itc:t2i_R@1",
        "--out",
        "cmp",
        cwd=runs,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = pd.read_csv(runs / "cmp" / "comparison.csv")
    assert list(table["method"].unique()) == [
        "shapes-demo pretrain.composer.name=uniform",
        "shapes-demo pretrain.composer.name=grit",
    ]
    t2 = 4.302652729749464  # t(0.975, 2)
    for metric, pick in (("rerank:R@1", lambda v: (v[0] + v[1]) / 2), ("itc:t2i_R@1", lambda v: v[1] - 10)):
        rows = table[table["metric"] == metric].set_index("method")
        for method in ("uniform", "grit"):
            values = [pick(VALUES[(method, s)]) for s in range(3)]
            mean = sum(values) / 3
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
            row = rows.loc[f"shapes-demo pretrain.composer.name={method}"]
            assert row["seeds"] == 3 and row["mean"] == pytest.approx(mean, abs=1e-6)
            assert (row["lo"], row["hi"]) == pytest.approx(
                (mean - t2 * std / math.sqrt(3), mean + t2 * std / math.sqrt(3)), abs=1e-6
            )
        diff = [pick(VALUES[("grit", s)]) - pick(VALUES[("uniform", s)]) for s in range(3)]
        mean = sum(diff) / 3
        half = t2 * math.sqrt(sum((d - mean) ** 2 for d in diff) / 2) / math.sqrt(3)
        row = rows.loc["shapes-demo pretrain.composer.name=grit"]
        assert row["paired_seeds"] == 3 and row["positive"] == sum(d > 0 for d in diff)
        assert (row["difference"], row["difference_lo"], row["difference_hi"]) == pytest.approx(
            (mean, mean - half, mean + half), abs=1e-6
        )
        assert row["verdict"] == ("higher" if mean - half > 0 else "lower" if mean + half < 0 else "—")
    per_seed = pd.read_csv(runs / "cmp" / "per_seed.csv")
    assert len(per_seed) == 12 and set(per_seed["seed"]) == {0, 1, 2}
    report = (runs / "cmp" / "comparison.md").read_text()
    assert "## rerank:R@1" in report and "paired-t 95%" in report and "runs/grit-s2" in report
    (runs / "cmp" / "comparison.csv").unlink(), (runs / "cmp" / "per_seed.csv").unlink()
    (runs / "cmp" / "comparison.md").unlink()
    assert_png(runs / "cmp" / "comparison.png")


def test_labels_baseline_and_default_metric(runs):
    proc = run_cli(
        "compare",
        *(f"runs/{m}-s{s}" for m in ("uniform", "grit") for s in range(3)),
        "--label",
        "U=*uniform*",
        "--label",
        "G=*grit*",
        "--baseline",
        "G",
        cwd=runs,
    )
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(runs / "runs" / "comparison" / "comparison.csv")  # (default: beside the first run)
    assert set(table["metric"]) == {"rerank:R@1"} and list(table["method"]) == ["U", "G"]
    assert table.set_index("method").loc["U", "difference"] < 0
    listed = run_cli("compare", "runs/uniform-s0", "--list-metrics", cwd=runs).stdout.split()
    assert {"rerank:R@1", "itc:R@1", "itc:oracle_R@1", "itc:i2t_R@5", "rerank:mean_R"} <= set(listed)


def test_one_seed_gets_its_binomial_interval_and_no_verdict(runs):
    proc = run_cli("compare", "runs/uniform-s0", "runs/grit-s0", "--metric", "itc:i2t_R@1", "--out", "one", cwd=runs)
    assert proc.returncode == 0, proc.stderr
    assert "one seed, no verdict" in proc.stdout + proc.stderr
    assert "trained on" not in proc.stdout + proc.stderr  # (every run: the same device and precision)
    row = pd.read_csv(runs / "one" / "comparison.csv").iloc[1]
    images = json.loads((runs / "runs" / "grit-s0" / "results" / "retrieval.json").read_text())["meta"]["images"]
    from falcon_cli.evaluation.intervals import wilson_interval

    assert (row["lo"], row["hi"]) == pytest.approx(wilson_interval(54.0, images), abs=1e-6)
    assert row["verdict"] == "one seed: no verdict" and row["interval"] == "binomial over queries"


@pytest.mark.parametrize(
    "break_it, words",
    [
        ("dataset", "pretrained on other pairs"),
        ("k", "measured with k = "),
        ("budget", "another budget"),
        ("no results", "no results yet"),
        ("metric", "no run has it"),
        ("same seed", "the same method"),
    ],
)
def test_runs_that_cannot_be_compared_get_one_line_and_nothing_is_written(runs, break_it, words):
    run = runs / "runs" / "grit-s2"
    manifest = json.loads((run / "manifest.json").read_text())
    result = json.loads((run / "results" / "retrieval.json").read_text())
    metric = "rerank:R@1"
    if break_it == "dataset":
        manifest["stages"]["pretrain"]["result"]["dataset_fingerprint"] = "0" * 64
    elif break_it == "k":
        result["meta"]["k"] = 16
        for other in (
            "uniform-s0",
            "grit-s0",
        ):  # (written before retrieval results recorded it: unknown, no difference)
            path = runs / "runs" / other / "results" / "retrieval.json"
            older = json.loads(path.read_text())
            del older["meta"]["split_fingerprint"]
            path.write_text(json.dumps(older))
    elif break_it == "budget":
        manifest["config"]["pretrain"]["epochs"] = 30
    elif break_it == "no results":
        shutil.rmtree(run / "results")
    elif break_it == "metric":
        metric = "vqa:accuracy"
    elif break_it == "same seed":
        manifest["seed"] = 1
    (run / "manifest.json").write_text(json.dumps(manifest))
    if (run / "results").exists():
        (run / "results" / "retrieval.json").write_text(json.dumps(result))
    proc = run_cli(
        "compare",
        *(f"runs/{m}-s{s}" for m in ("uniform", "grit") for s in range(3)),
        "--metric",
        metric,
        "--out",
        "cmp",
        cwd=runs,
    )
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    if break_it not in ("metric", "same seed"):
        assert str(Path("runs") / "grit-s2") in proc.stderr
    assert not (runs / "cmp").exists()
    if break_it == "dataset":  # (another device or precision is no refusal: a warning in the report)
        manifest["stages"]["pretrain"]["result"].update(device="cuda:0", precision="bf16")
        (run / "manifest.json").write_text(json.dumps(manifest))
    if break_it in ("dataset", "k", "budget"):  # compared anyway when asked, and flagged
        proc = run_cli(
            "compare",
            *(f"runs/{m}-s{s}" for m in ("uniform", "grit") for s in range(3)),
            "--metric",
            metric,
            "--out",
            "cmp",
            "--allow-mismatch",
            cwd=runs,
        )
        report = (runs / "cmp" / "comparison.md").read_text()
        assert proc.returncode == 0 and words in report
        assert ("the runs trained on cpu fp32 and on cuda:0 bf16" in report) == (break_it == "dataset")


def test_what_identifies_a_runs_pretraining_pairs(tmp_path):
    """Every identity a manifest gives, most precise first (the pretrain stage's fingerprint, the shard index's, the
    shapes world's generation config wherever the world lies, the data path); two runs are compared on the most
    precise kind both have, so a run from before the fingerprint existed still pairs with one after it."""
    from falcon_cli.evaluation.compare import _dataset_identities, same_pairs

    for place in ("world", "copy"):  # the same generated world in two places is one dataset
        (tmp_path / place).mkdir()
        (tmp_path / place / "world.json").write_text(
            json.dumps({"config": {"preset": "dense", "images": 9, "x": None}})
        )
    new = {
        "config": {"data": {"dataset": str(tmp_path / "world")}},
        "stages": {
            "pretrain": {"result": {"dataset_fingerprint": "ab" * 32}},
            "data": {"result": {"shard_index": {"fingerprint": "cd" * 32}}},
        },
    }
    found = _dataset_identities(new)
    assert list(found) == ["pairs", "shards", "shapes world", "path"] and found["pairs"] == "ab" * 6
    old = {"config": {"data": {"dataset": str(tmp_path / "copy")}}, "stages": {}}
    assert list(_dataset_identities(old)) == ["shapes world", "path"]
    assert same_pairs(found, _dataset_identities(old)) == (
        True,
        f"shapes world {found['shapes world']} vs {found['shapes world']}",
    )
    other = {**new, "stages": {"pretrain": {"result": {"dataset_fingerprint": "ef" * 32}}}}
    assert same_pairs(found, _dataset_identities(other)) == (False, f"pairs {'ef' * 6} vs {'ab' * 6}")
    assert same_pairs({"path": "a"}, {"path": "b"})[0] is False


def test_coco_results_give_their_false_negative_aware_metrics_both_ways_averaged(tmp_path):
    """A COCO run's rows (ECCV, CxC and COCO 5k keys, a fine-tuned model beside the pretrained one) are read as the
    shapes runs' are: every number by name, each pair of directions also averaged, counts for the intervals."""
    from falcon_cli.evaluation.compare import read_run, single_run_interval

    run = tmp_path / "coco-run"
    (run / "results").mkdir(parents=True)
    (run / "manifest.json").write_text(
        json.dumps(
            {
                "seed": 3,
                "world_size": 8,
                "config": {"name": "coco-albef", "data": {"dataset": "data/coco"}, "pretrain": {"epochs": 30}},
            }
        )
    )
    rows = [
        {
            "model": "pretrained",
            "scoring": "itc+itm@256",
            "i2t_R@1": 60.0,
            "t2i_R@1": 40.0,
            "eccv_i2t_mAP@R": 30.0,
            "eccv_t2i_mAP@R": 40.0,
            "coco5k_i2t_R@1": 61.0,
            "coco5k_t2i_R@1": 41.0,
            "max_text_length": 30,
            "resolution": 384,
        },
        {
            "model": "finetuned",
            "scoring": "itc",
            "i2t_R@1": 70.0,
            "t2i_R@1": 50.0,
            "max_text_length": 30,
            "resolution": 384,
        },
    ]
    (run / "results" / "retrieval.json").write_text(
        json.dumps(
            {"meta": {"dataset": "coco", "split": "test", "k": 256, "images": 5000, "texts": 25000}, "rows": rows}
        )
    )
    (run / "results" / "vqa.json").write_text(
        json.dumps({"meta": {"dataset": "coco"}, "rows": [{"split": "test", "questions": 1000, "accuracy": 71.5}]})
    )
    found = read_run(run)
    assert found.seed == 3 and found.recipe == "coco-albef" and found.dataset == {"path": "data/coco"}
    assert found.metrics["rerank:R@1"] == 50.0 and found.metrics["rerank:eccv_mAP@R"] == 35.0
    assert found.metrics["rerank:coco5k_R@1"] == 51.0 and found.metrics["finetuned/itc:R@1"] == 60.0
    assert found.metrics["vqa:accuracy"] == 71.5 and found.counts["vqa:accuracy"] == 1000
    lo, hi = single_run_interval("rerank:R@1", 50.0, found)
    half = 1.959963984540054 * math.sqrt(0.6 * 0.4 / 5000 + 0.4 * 0.6 / 25000) / 2
    assert (lo, hi) == pytest.approx((50 - 100 * half, 50 + 100 * half))


def test_flag_metrics_compare_and_a_method_without_them_is_refused(runs):
    """``flags:precision`` is the last epoch's record of what the method flagged against the oracle (a resumed run's
    record written again counts once); a run whose method gives no such number is refused with one line."""
    precision = {0: (0.2, 0.3), 1: (0.25, 0.31), 2: (0.22, 0.36)}  # seed -> (uniform-named, grit-named) last epoch
    for method, index in (("uniform", 0), ("grit", 1)):
        for seed in range(3):
            run = runs / "runs" / f"{method}-s{seed}"
            manifest = json.loads((run / "manifest.json").read_text())
            manifest["config"]["pretrain"]["false_negatives"]["method"] = "glofnd"
            (run / "manifest.json").write_text(json.dumps(manifest))
            records = [
                {"kind": "false_negatives", "epoch": 0, "step": 2, "precision": 0.9, "flagged": 4},
                {"kind": "false_negatives", "epoch": 1, "step": 4, "precision": 0.8, "flagged": 5},
                {"kind": "false_negatives", "epoch": 1, "step": 4, "precision": precision[seed][index], "flagged": 6},
            ]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = run_cli(
        "compare",
        *(f"runs/{m}-s{s}" for m in ("uniform", "grit") for s in range(3)),
        "--label",
        "U=*uniform*",
        "--label",
        "G=*grit*",
        "--baseline",
        "U",
        "--metric",
        "flags:precision",
        "--out",
        "cmp",
        cwd=runs,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = pd.read_csv(runs / "cmp" / "comparison.csv").set_index("method")
    assert table.loc["G", "mean"] == pytest.approx(sum(v[1] for v in precision.values()) / 3, abs=1e-6)
    assert table.loc["G", "difference"] == pytest.approx(sum(v[1] - v[0] for v in precision.values()) / 3, abs=1e-6)
    (runs / "runs" / "grit-s2" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    proc = run_cli(
        "compare",
        *(f"runs/{m}-s{s}" for m in ("uniform", "grit") for s in range(3)),
        "--label",
        "U=*uniform*",
        "--label",
        "G=*grit*",
        "--metric",
        "flags:precision",
        "--out",
        "cmp2",
        cwd=runs,
    )
    assert proc.returncode == 2 and not (runs / "cmp2").exists()
    (line,) = proc.stderr.strip().splitlines()
    assert "grit-s2: its method (pretrain.false_negatives.method=glofnd) gives no flags:precision" in line


def _with_inputs(runs: Path, method: str, seed: int, values: tuple[float, float], **inputs) -> Path:
    """A copy of grit-s``seed`` as ``method`` with per-seed ``inputs`` (``{key: absolute path}``) in its config."""
    run = runs / "runs" / f"{method}-s{seed}"
    shutil.copytree(runs / "runs" / f"grit-s{seed}", run)
    manifest = json.loads((run / "manifest.json").read_text())
    pretrain = manifest["config"]["pretrain"]
    pretrain["false_negatives"]["method"] = method
    for key, path in inputs.items():
        pretrain["false_negatives"][method][key] = str(path)
    (run / "manifest.json").write_text(json.dumps(manifest))
    result = json.loads((run / "results" / "retrieval.json").read_text())
    for row in result["rows"]:
        row["i2t_R@1"], row["t2i_R@1"] = values
    (run / "results" / "retrieval.json").write_text(json.dumps(result))
    return run


def _auxiliary(runs: Path, seed: int, encoder: str) -> Path:
    """An embed run of seed ``seed`` whose encoder is ``runs/<encoder>-s<seed>``: SRCL's auxiliary embeddings."""
    aux = runs / "runs" / f"aux-s{seed}"
    (aux / "embeddings").mkdir(parents=True)
    (aux / "embeddings" / "embeddings.h5").write_bytes(b"h5")
    manifest = json.loads((runs / "runs" / f"uniform-s{seed}" / "manifest.json").read_text())
    manifest["config"]["embed"]["encoder"] = f"falcon:{runs / 'runs' / f'{encoder}-s{seed}'}"
    (aux / "manifest.json").write_text(json.dumps(manifest))
    return aux / "embeddings" / "embeddings.h5"


def test_per_seed_inputs_do_not_make_a_method_but_what_made_them_must_agree(runs):
    """MAFA's Con-D and SRCL's auxiliary embeddings are files each seed has its own: three seeds of each are one
    method with a paired interval; an input made on other pairs, or seeds whose inputs other methods made, are
    refused with one line."""
    for seed in range(3):
        base = VALUES[("uniform", seed)]
        _with_inputs(runs, "mafa", seed, (base[0] + 2, base[1] + 1), judge_model=runs / "runs" / f"uniform-s{seed}")
        _with_inputs(runs, "srcl", seed, (base[0] - 1, base[1]), aux_embeddings=_auxiliary(runs, seed, "uniform"))
    names = [f"runs/{m}-s{s}" for m in ("uniform", "mafa", "srcl") for s in range(3)]
    proc = run_cli("compare", *names, "--metric", "rerank:i2t_R@1", "--out", "cmp", cwd=runs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = pd.read_csv(runs / "cmp" / "comparison.csv")
    assert len(table) == 3 and list(table["seeds"]) == [3, 3, 3], table
    assert not any("/" in method for method in table["method"]), list(table["method"])  # (no path in a label)
    paired = table.set_index("method").filter(like="false_negatives.method=mafa", axis=0).iloc[0]
    assert paired["paired_seeds"] == 3 and paired["difference"] == pytest.approx(2.0)

    # SRCL seed 1's auxiliary model was trained on another world: refused, and nothing written.
    uniform = runs / "runs" / "uniform-s1" / "manifest.json"
    kept = uniform.read_text()
    manifest = json.loads(kept)
    manifest["stages"]["pretrain"]["result"]["dataset_fingerprint"] = "0" * 64
    uniform.write_text(json.dumps(manifest))
    proc = run_cli("compare", *(n for n in names if "srcl" in n), "--metric", "rerank:R@1", "--out", "bad", cwd=runs)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and not (runs / "bad").exists(), proc.stderr
    assert (
        "srcl-s1: its pretrain.false_negatives.srcl.aux_embeddings comes from" in line
        and "trained on other pairs" in line
    ), line
    uniform.write_text(kept)

    # SRCL seed 2's auxiliary model is a GRIT run, the other seeds' a uniform one: one line, naming both.
    shutil.rmtree(runs / "runs" / "aux-s2")
    _auxiliary(runs, 2, "grit")
    proc = run_cli("compare", *names, "--metric", "rerank:R@1", "--out", "bad", cwd=runs)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and not (runs / "bad").exists(), proc.stderr
    assert (
        "srcl-s2's pretrain.false_negatives.srcl.aux_embeddings was made otherwise than runs/srcl-s0's (embed.encoder: "
        in line
        and "pretrain.composer.name: grit vs uniform" in line
        and "--label" in line
    ), line


def _t_holds_zero(a, b, r):
    """The reference: the paired t interval of a − r·b holds zero (straight from mean_interval)."""
    m = mean_interval([x - r * y for x, y in zip(a, b)])
    return m.lo <= 0.0 <= m.hi


def test_fiellers_interval_is_every_ratio_whose_paired_difference_holds_zero():
    from falcon_cli.evaluation.intervals import paired_ratio

    a, b = [6.1, 5.3, 7.0, 6.4, 5.9], [9.0, 3.8, 15.2, 10.1, 10.2]  # a gain and its ceiling's, correlated by seed
    found = paired_ratio(a, b)
    assert found.bounded and found.ratio == pytest.approx(sum(a) / sum(b))
    assert found.lo < found.ratio < found.hi
    # every ratio on a grid is inside exactly when its paired difference holds zero, and each bound is an edge of
    # that set to 1e-4 (the reference's own answer on either side of it)
    for r in (i / 100 for i in range(0, 300)):
        assert _t_holds_zero(a, b, r) == (found.lo <= r <= found.hi), r
    for edge, inward in ((found.lo, 1e-4), (found.hi, -1e-4)):
        assert _t_holds_zero(a, b, edge + inward) and not _t_holds_zero(a, b, edge - inward), edge
    # a ceiling with no spread: the ratio's interval is the numerator's t interval over the constant
    constant = paired_ratio(a, [4.0] * 5)
    m = mean_interval(a)
    assert (constant.lo, constant.hi) == (pytest.approx(m.lo / 4.0), pytest.approx(m.hi / 4.0))


def test_fiellers_interval_is_unbounded_where_the_denominator_is_not_away_from_zero():
    from falcon_cli.evaluation.intervals import paired_ratio

    a, b = [6.1, 5.3, 7.0], [20.0, -5.0, 15.0]  # b's own t interval holds zero
    assert mean_interval(b).lo < 0 < mean_interval(b).hi
    found = paired_ratio(a, b)
    assert not found.bounded and (found.lo, found.hi) == (-math.inf, math.inf)
    assert not paired_ratio([1.0], [2.0]).bounded and paired_ratio([1.0], [2.0]).ratio == 0.5
    with pytest.raises(ValueError, match="pair them by seed"):
        paired_ratio([1.0, 2.0], [1.0])
