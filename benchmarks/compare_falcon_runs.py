"""Compare FALCON runs side by side: what the scheduler did, how noisy its signal was, and retrieval.

    falcon run --recipe shapes-falcon --run-dir runs/sf-none
    falcon run --recipe shapes-falcon-ema --run-dir runs/sf-ema
    PYTHONPATH=. .venv/bin/python benchmarks/compare_falcon_runs.py runs/sf-none runs/sf-ema

Per run: the scheduler settings (from ``config.yaml``); per FALCON epoch the mean and spread
of the q's used and how far the Beta parameters moved from their initial 0.974; the reward's
mean and std over the epoch and the mean squared advantage (the REINFORCE weight's second
moment, what a reward baseline is meant to shrink; logged steps only); and the trained
model's zero-shot retrieval.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falcon_cli.artifacts.renamed_keys import upgrade_stored  # noqa: E402
from falcon_cli.runtime.metrics import read_metrics  # noqa: E402
from falcon_cli.sampling.batch_log import read_batch_log  # noqa: E402

INITIAL_BETA_PARAMETER = 0.974


def describe(run: Path) -> list[str]:
    config = upgrade_stored(yaml.safe_load((run / "config.yaml").read_text()), "config.yaml")["pretrain"]
    s = config["scheduler"]
    lines = [
        f"{run}: reward {s['reward']['name']}, baseline {s['update']['baseline']}, "
        f"scheduler lr {s['lr']}, level {s['level']}, lag {s['lag']}"
    ]
    log = read_batch_log(run / "batches.parquet")
    chained = log[(log["sampler"] == "falcon") & log["q"].notna()]
    records = read_metrics(run / "metrics.jsonl")
    summaries = {r["epoch"]: r for r in records if r.get("kind") == "epoch_summary"}
    lines.append(
        "  epoch  q mean  q std  q p10  q p90  |α-0.974| max  |β-0.974| max  reward mean ± std  advantage² mean"
    )
    for epoch, rows in chained.groupby("epoch"):
        advantages = [r["advantage"] for r in records if r["epoch"] == epoch and r.get("advantage") is not None]
        advantage2 = f"{sum(a * a for a in advantages) / len(advantages):15.2e}" if advantages else f"{'n/a':>15}"
        summary, q = summaries[epoch], rows["q"]
        lines.append(
            f"  {epoch:5d}  {q.mean():6.3f}  {q.std():5.3f}  {q.quantile(0.1):5.3f}  {q.quantile(0.9):5.3f}  "
            f"{(rows['alpha'] - INITIAL_BETA_PARAMETER).abs().max():13.4f}  "
            f"{(rows['beta'] - INITIAL_BETA_PARAMETER).abs().max():13.4f}  "
            f"{summary['reward_mean']:8.4f} ± {summary['reward_std']:.4f}  {advantage2}"
        )
    results = json.loads((run / "results" / "retrieval_zeroshot.json").read_text())["rows"][-1]
    lines.append("  retrieval: " + ", ".join(f"{k} {v:.1f}" for k, v in results.items() if k != "model"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of FALCON pretraining runs")
    for run in parser.parse_args().runs:
        print("\n".join(describe(run)))


if __name__ == "__main__":
    main()
