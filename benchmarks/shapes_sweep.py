"""The shapes-world method comparison: every method × seed on one world, one budget, one evaluation.

    PYTHONPATH=. .venv/bin/python benchmarks/shapes_sweep.py --out runs/sweep                 # the full sweep
    PYTHONPATH=. .venv/bin/python benchmarks/shapes_sweep.py --out /tmp/sweep --quick         # a smoke version
    PYTHONPATH=. .venv/bin/python benchmarks/shapes_sweep.py --out runs/sweep --only falcon grit --seeds 0 1 2

Each (method, seed) is a shipped shapes recipe run with the same world and budget overrides
(``falcon run``), then scored the same way: zero-shot ITC retrieval with the oracle's
false-negative-aware metrics (``falcon evaluate retrieval --itc-only``) and the oracle's
false-negative rate of the negatives the run actually used (``falcon audit-false-negatives
--judge oracle``). The sweep is resumable and can run in the background: a run whose three
parts are complete is skipped, so running the command again after a stop continues it.

Writes ``OUT/results.csv`` (one row per run), ``OUT/summary.csv`` and ``OUT/summary.md`` (mean ± std
over seeds per method) and ``OUT/r1_vs_time.png`` (mean R@1 against seconds of pretraining).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

METHODS: dict[str, tuple[str, list[str]]] = {
    "uniform": ("shapes-uniform", []),
    "grit": ("shapes-grit", []),
    "q0": ("shapes-q0", []),
    "q05": ("shapes-q05", []),
    "hardening": ("shapes-hardening", []),
    "softening": ("shapes-softening", []),
    "mafa": ("shapes-mafa", []),
    "srcl": ("shapes-srcl", []),  # its auxiliary model is this seed's uniform run
    "diht": ("shapes-diht", []),
    "glofnd": ("shapes-glofnd", []),
    "falcon": ("shapes-falcon", []),
    "falcon-batch": ("shapes-falcon-batch-level", []),
    "falcon-itc-itm": ("shapes-falcon-reward-itc-itm", []),
    "falcon-baseline": ("shapes-falcon-ema", []),
}
"""Method name -> (recipe, extra overrides)."""

QUICK = ["data.shapes.images=200", "pretrain.epochs=2", "pretrain.batch_size=16", "pretrain.search_space_size=64",
         "pretrain.warmup_steps=5", "pretrain.num_workers=0"]
"""The --quick budget: a 200-image world, two short epochs."""


def falcon(*args: str, log: Path) -> None:
    """Run ``falcon ARGS`` (appending its output to ``log``); stop the sweep with the log's tail on failure."""
    with log.open("a") as out:
        out.write(f"\n$ falcon {' '.join(args)}\n")
        out.flush()
        proc = subprocess.run([sys.executable, "-m", "falcon_cli", *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              env={"PYTHONPATH": str(REPO), "FALCON_PROGRESS": "0", "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise SystemExit(f"falcon {' '.join(args)} failed (exit {proc.returncode}); {log}:\n{tail}")


def completed(run: Path, stage: str) -> bool:
    manifest = run / "manifest.json"
    return manifest.exists() and json.loads(manifest.read_text()).get("stages", {}).get(stage, {}).get("status") == "completed"


def run_one(method: str, seed: int, out: Path, scale: list[str], audit_pairs: int) -> dict:
    """Train, evaluate and audit one (method, seed), skipping the parts already done; its row of numbers."""
    recipe, extra = METHODS[method]
    run = out / "runs" / f"{method}-s{seed}"
    log = out / "logs" / f"{method}-s{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    overrides = [f"seed={seed}", f"data.dataset={out / 'world'}", *scale, *extra]
    if method == "srcl":
        overrides.append(f"embed.encoder=falcon:{out / 'runs' / f'uniform-s{seed}'}")
    if not completed(run, "pretrain"):
        falcon("run", "--recipe", recipe, "--run-dir", str(run), "--overwrite", *overrides, log=log)
    if not (run / "results" / "retrieval.json").exists():
        falcon("evaluate", "retrieval", str(run), "--itc-only", log=log)
    if not (run / "audit" / "summary.json").exists():
        falcon("audit-false-negatives", str(run), "--judge", "oracle", "--max-pairs", str(audit_pairs), log=log)
    return collect(method, seed, run)


def collect(method: str, seed: int, run: Path) -> dict:
    """One run's numbers: retrieval (standard and oracle), FN rate of the used negatives, time per epoch."""
    manifest = json.loads((run / "manifest.json").read_text())
    stage = manifest["stages"]["pretrain"]
    seconds = _seconds(stage["start"], stage["end"])
    epochs = manifest["config"]["pretrain"]["epochs"]
    retrieval = json.loads((run / "results" / "retrieval.json").read_text())["rows"][0]
    audit = {row["kind"]: row for row in json.loads((run / "audit" / "summary.json").read_text())["overall"]}
    row = {"method": method, "seed": seed, "pretrain_seconds": seconds, "seconds_per_epoch": seconds / epochs}
    for key in ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10", "mean_R",
                "oracle_i2t_R@1", "oracle_t2i_R@1", "oracle_i2t_R-P", "oracle_t2i_R-P", "oracle_i2t_mAP@R", "oracle_t2i_mAP@R"):
        row[key] = retrieval[key]
    for kind in ("chain", "itm", "all"):
        if kind in audit:
            row[f"fn_rate_{kind}"] = 100.0 * audit[kind]["oracle_rate"]
    row["R@1"] = (row["i2t_R@1"] + row["t2i_R@1"]) / 2
    return row


def _seconds(start: str, end: str) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def summarise(rows: list[dict], out: Path) -> None:
    """``results.csv``, ``summary.csv``/``summary.md`` (mean ± std over seeds) and ``r1_vs_time.png``."""
    import pandas as pd

    from falcon_cli.reporting.figures import _save_png as save_png  # atomic PNG writer

    table = pd.DataFrame(rows)
    table.to_csv(out / "results.csv", index=False, float_format="%.4f")
    columns = ["R@1", "mean_R", "oracle_i2t_R@1", "oracle_t2i_R@1", "oracle_i2t_R-P", "oracle_t2i_R-P",
               "fn_rate_chain", "fn_rate_itm", "seconds_per_epoch"]
    columns = [c for c in columns if c in table]
    grouped = table.groupby("method", sort=False)[columns]
    mean, std, seeds = grouped.mean(), grouped.std().fillna(0.0), grouped.size()
    summary = mean.join(std.add_suffix("_std")).assign(seeds=seeds)
    summary.to_csv(out / "summary.csv", float_format="%.4f")
    lines = ["| method | seeds | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for method in mean.index:
        cells = ["—" if mean.loc[method, c] != mean.loc[method, c] else f"{mean.loc[method, c]:.1f} ± {std.loc[method, c]:.1f}"
                 for c in columns]  # — : the method has no such negatives (no chain without a quantile composer)
        lines.append(f"| {method} | {seeds[method]} | " + " | ".join(cells) + " |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in mean.index:
        ax.errorbar(mean.loc[method, "seconds_per_epoch"], mean.loc[method, "R@1"], yerr=std.loc[method, "R@1"],
                    fmt="o", capsize=3, label=method)
    ax.set_xlabel("seconds per pretraining epoch")
    ax.set_ylabel("R@1 (mean of i2t and t2i, %)")
    ax.set_title("zero-shot R@1 against training time (shapes world)")
    ax.legend(fontsize=7, ncol=2)
    save_png(fig, out / "r1_vs_time.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="Sweep directory (world, runs, logs, tables).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", choices=list(METHODS), help="A subset of the methods.")
    parser.add_argument("--quick", action="store_true", help="Smoke version: one seed, a 200-image world, 2 short epochs.")
    parser.add_argument("--audit-pairs", type=int, default=20000, help="Pairs the oracle audit judges per run.")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="Extra overrides for every run.")
    args = parser.parse_args()

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    seeds = args.seeds[:1] if args.quick else args.seeds
    scale = (QUICK if args.quick else []) + list(args.overrides)
    methods = list(args.only or METHODS)
    if "srcl" in methods and "uniform" not in methods:
        methods.insert(0, "uniform")  # SRCL's auxiliary model
    rows = []
    start = time.perf_counter()
    for seed in seeds:
        for method in methods:
            rows.append(run_one(method, seed, out, scale, 2000 if args.quick else args.audit_pairs))
            print(f"[{time.perf_counter() - start:7.0f} s] {method} seed {seed}: R@1 {rows[-1]['R@1']:.1f}, "
                  f"oracle i2t R@1 {rows[-1]['oracle_i2t_R@1']:.1f}, FN rate (chain) {rows[-1].get('fn_rate_chain', float('nan')):.1f}%",
                  flush=True)
    summarise(rows, out)


if __name__ == "__main__":
    main()
