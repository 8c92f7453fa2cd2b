"""Issue 70's pilots: each candidate scheduler on one seed, 8 FALCON epochs after the uniform epoch, on ``coco-like``
and on ``dense``, judged by criteria fixed before any run.

    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_pilots.py --out runs/pilots \\
        --reuse runs/phase-dense --jobs 1 --threads 1          # train what is missing, then the table
    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_pilots.py --out runs/pilots --collect --report docs/results.md
    PYTHONPATH=. .venv/bin/python benchmarks/scheduler_pilots.py \
        --charges runs/pilots/runs/dense/falcon-rank-oracle-s0 --report docs/results.md   # what B's charge asks

The runs are ``benchmarks/phase_sweep.py``'s, with its ``cpu`` budget at 9 epochs (``--set epochs=9``; the cosine
schedule spans the 9), seed 0, the candidates of :data:`~benchmarks.phase_sweep.PILOTS` (``--only`` picks some), and
every run trained, evaluated and audited as the sweep's are. ``--reuse DIR`` links an earlier sweep's worlds and
unimodal encoders into OUT (a world is generated once per preset, its encoders trained once: an hour or more each
on a CPU). The sweep is resumable: a finished run is skipped.

The criteria (issue 70, fixed before the first pilot), read from each run's last epoch:

* ``coco-like`` passes when at least 20% of the chain's picks are the anchor's top candidate and a sibling scene
  shares a batch with at least 15% of the rows (GRIT: 19.6%; uniform: 4.1%);
* ``dense`` passes when at most 30% of the chain's picks are false negatives (GRIT 46.9%, q = 0.5 14.2%) and
  corr(E[q], the anchor's false-negative density) is at most −0.3.

A candidate goes on to five paired seeds only if it passes both. ``--report`` rewrites the block of
docs/results.md between ``scheduler-pilots:begin`` / ``:end``; ``pilots.csv`` is written to OUT. The follow-up
pilots (:data:`~benchmarks.phase_sweep.FOLLOW_UPS`, run when ``--only`` names them) are marked as such.

``--charges RUN`` reads what a candidate-B run's reward asks for (:func:`charge_window`): for each charge w of a false
pick, the pilots' `dense` criterion applied to the best learner of that reward that knew each anchor's false-negative
density; ``--report`` then rewrites the block between ``charge-window:begin`` / ``:end``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.phase_sweep import FOLLOW_UPS, PILOTS  # noqa: E402
from benchmarks.scheduler_bandit import replace_block  # noqa: E402
from benchmarks.scheduler_sweep import epoch_rows  # noqa: E402
from benchmarks.shapes_sweep import Variant, collect  # noqa: E402

BEGIN, END = "<!-- scheduler-pilots:begin -->", "<!-- scheduler-pilots:end -->"
CHARGE_BEGIN, CHARGE_END = "<!-- charge-window:begin -->", "<!-- charge-window:end -->"
CHARGES = (0.1, 0.25, 0.5, 0.6, 0.75, 1.0, 2.0)
"""The charges of a false pick :func:`charge_window` tries (candidate B's recipes charge 2)."""
PRESETS = ("coco-like", "dense")
EPOCHS = 9
"""The uniform epoch, then 8 FALCON epochs."""
SEED = 0
CRITERIA = {
    "coco-like": "top candidate ≥ 20% of picks and siblings in batch ≥ 15% of rows",
    "dense": "chain FN ≤ 30% and corr(E[q], FN density) ≤ −0.3",
}


def pilot_row(preset: str, method: str, run: Path) -> dict:
    """A finished pilot's last-epoch numbers and its verdict."""
    from falcon_cli.sampling.batch_log import read_batch_log

    log = read_batch_log(run / "batches.parquet")
    last = int(log["epoch"].max())
    chained = log[(log["epoch"] == last) & log["q"].notna()]
    epochs = epoch_rows(method, SEED, run)
    summary = epochs[-1] if epochs else {}
    audit = json.loads((run / "audit" / "summary.json").read_text())
    shares = [s for s in audit.get("near_misses_in_batch") or [] if int(s["epoch"]) == last]
    retrieval = collect(Variant(method), SEED, run)  # (ITC R@1 and its false-negative-aware version, for the record)
    row = {
        "preset": preset,
        "method": method,
        "epoch": last,
        "R@1": retrieval["R@1"],
        "oracle_R@1": retrieval["oracle_R@1"],
        "top_share": float((chained["quantile_rank"] >= 1.0).mean()) if len(chained) else float("nan"),
        "sibling_share": float(shares[0]["share"]) if shares else float("nan"),
        "chain_fn_rate": _number(summary.get("chain_fn_rate")),
        "q_fn_density_corr": _number(summary.get("q_fn_density_corr")),
        "q_mean": float(chained["q"].mean()) if len(chained) else float("nan"),
    }
    row["passes"] = passes(preset, row)
    return row


def passes(preset: str, row: dict) -> bool:
    """The issue's criterion for ``preset`` (:data:`CRITERIA`); a number the run lacks fails it."""
    if preset == "coco-like":
        return bool(row["top_share"] >= 0.2 and row["sibling_share"] >= 0.15)
    return bool(row["chain_fn_rate"] <= 0.3 and row["q_fn_density_corr"] <= -0.3)


def _cell(value: float, spec: str) -> str:
    """A table cell: the number, or — where the run has none (no near-miss families in `dense`)."""
    return "—" if value != value else format(value, spec)


def _number(value) -> float:
    return float("nan") if value is None else float(value)


def markdown(frame) -> list[str]:
    """The report block: every pilot's numbers, passed or not, and each candidate's verdict over both worlds."""
    lines = [
        f"Generated by `PYTHONPATH=. .venv/bin/python benchmarks/scheduler_pilots.py --out OUT --collect --report "
        f"docs/results.md`: one seed, {EPOCHS} epochs (the uniform epoch, then FALCON), the `cpu` budget otherwise.",
        "",
        "| world | candidate | top candidate, % of picks | siblings in batch, % of rows | chain FN % | "
        "corr(E[q], FN density) | mean q | ITC R@1 | FN-aware ITC R@1 | passes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in frame.to_dict("records"):
        nan = float("nan")
        name = f"{row['method']} (follow-up)" if row["method"] in FOLLOW_UPS else row["method"]
        lines.append(
            f"| {row['preset']} | {name} | {_cell(100 * row['top_share'], '.1f')} | "
            f"{_cell(100 * row['sibling_share'], '.1f')} | {_cell(100 * row['chain_fn_rate'], '.1f')} | "
            f"{_cell(row['q_fn_density_corr'], '+.2f')} | {_cell(row['q_mean'], '.2f')} | "
            f"{_cell(row.get('R@1', nan), '.1f')} | {_cell(row.get('oracle_R@1', nan), '.1f')} | "
            f"{'yes' if row['passes'] else 'no'} |"
        )
    verdicts = frame.groupby("method")["passes"].agg(["all", "size"])
    both = [m for m, v in verdicts.iterrows() if v["all"] and v["size"] == len(PRESETS)]
    lines += [
        "",
        "Criteria (fixed before the first pilot): "
        + "; ".join(f"`{p}`: {c}" for p, c in CRITERIA.items())
        + ". "
        + (f"Passes both: {', '.join(both)}." if both else "No candidate passes both (yet)."),
    ]
    return lines


def charge_window(log, charges=CHARGES, *, last_epochs: int = 3, bins: int = 10):
    """What candidate B's reward asks of the best learner that knew each anchor's false-negative density, from a
    run's batch log (its chained slots in the last ``last_epochs`` epochs).

    For each charge w: the anchors are split into ``bins`` quantiles of their false-negative density; each bin takes
    the one of the logged fixed q's (:data:`~falcon_cli.sampling.composers.FIXED_Q_LEVELS`; the ``fn_at_q*`` fields
    say whether that q's pick would be false) with the highest mean worth (1 − f)·q − w·f (B's worth with a perfect
    judge, a pick's rank on the chain's scale taken as its q; ties go to the easier q). The choices give the chain's
    false-negative rate, corr(q, density) and the mean q, and the pilots' `dense` criterion is applied to them.
    In-sample and limited to five q's: what the reward rewards, not what a scheduler reaches."""
    import numpy as np
    import pandas as pd

    from falcon_cli.sampling.composers import FIXED_Q_FIELDS, FIXED_Q_LEVELS

    chained = log[log["q"].notna() & log["anchor_fn_density"].notna()]
    chained = chained[chained["epoch"] > int(chained["epoch"].max()) - last_epochs]
    density = chained["anchor_fn_density"].to_numpy(np.float64)
    group = pd.qcut(density, bins, labels=False, duplicates="drop")
    levels = np.asarray(FIXED_Q_LEVELS, dtype=np.float64)
    false = chained[list(FIXED_Q_FIELDS)].to_numpy(np.float64)  # [rows, levels]
    rows = []
    for w in charges:
        chosen = np.empty(len(chained))
        chosen_false = np.empty(len(chained))
        for g in np.unique(group):
            inside = group == g
            worth = ((1 - false[inside]) * levels - w * false[inside]).mean(0)
            best = int(np.argmax(worth))
            chosen[inside], chosen_false[inside] = levels[best], false[inside, best]
        corr = float(np.corrcoef(chosen, density)[0, 1]) if chosen.std() > 0 else float("nan")
        row = {"charge": w, "chain_fn_rate": float(chosen_false.mean()), "q_fn_density_corr": corr,
               "q_mean": float(chosen.mean())}  # fmt: skip
        row["passes"] = passes("dense", row)
        rows.append(row)
    return pd.DataFrame(rows)


def charge_markdown(frame, run: Path) -> list[str]:
    """The ``--charges`` block: per charge, what its best density-aware learner gives and the dense verdict."""
    lines = [
        f"Generated by `PYTHONPATH=. .venv/bin/python benchmarks/scheduler_pilots.py --charges {run} --report "
        "docs/results.md`: the run's chained picks in its last 3 epochs, anchors in 10 quantiles of their "
        "false-negative density, each quantile at its best of q ∈ {0, 0.25, 0.5, 0.75, 1} under (1 − f)·q − w·f.",
        "",
        "| charge w of a false pick | chain FN % | corr(q, FN density) | mean q | passes `dense` |",
        "|---|---|---|---|---|",
    ]
    for row in frame.to_dict("records"):
        lines.append(
            f"| {row['charge']:g} | {100 * row['chain_fn_rate']:.1f} | {_cell(row['q_fn_density_corr'], '+.2f')} | "
            f"{row['q_mean']:.2f} | {'yes' if row['passes'] else 'no'} |"
        )
    return lines


def link_reused(out: Path, reuse: Path) -> None:
    """Link ``reuse``'s generated worlds, world runs and unimodal encoders into ``out`` (what it lacks only)."""
    for part in ("worlds", "world-runs", "unimodal"):
        source = reuse / part
        if not source.is_dir():
            continue
        (out / part).mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():
            target = out / part / entry.name
            if not target.exists():
                target.symlink_to(entry.resolve())


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    parser.add_argument(
        "--only", nargs="+", choices=PILOTS + FOLLOW_UPS, help="train these (default the pre-registered pilots)"
    )
    parser.add_argument("--charges", type=Path, metavar="RUN", help="what a candidate-B run's charge asks for")
    parser.add_argument("--reuse", type=Path, help="an earlier sweep's OUT whose worlds and encoders to link")
    parser.add_argument("--budget", default="cpu", help="phase_sweep's budget (quick: a smoke test of the chain)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--collect", action="store_true", help="train nothing: only the table")
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    if args.charges is not None:
        return report_charges(args.charges, args.report)
    if args.out is None:
        parser.error("--out is required (or --charges RUN)")

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.reuse is not None:
        link_reused(out, args.reuse.resolve())
    if not args.collect:
        epochs = [] if args.budget == "quick" else ["--set", f"epochs={EPOCHS}"]
        command = [sys.executable, str(REPO / "benchmarks" / "phase_sweep.py"), "--out", str(out), "--budget",
                   args.budget, *epochs, "--presets", *args.presets, "--seeds", str(SEED), "--only",
                   *(args.only or PILOTS),
                   "--jobs", str(args.jobs)] + (["--threads", str(args.threads)] if args.threads else [])  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run(command, check=True, cwd=REPO, env=env)
    rows = [
        pilot_row(preset, method, out / "runs" / preset / f"{method}-s{SEED}")
        for preset in args.presets
        for method in args.only or PILOTS + FOLLOW_UPS  # (the table: every finished pilot, follow-ups too)
        if (out / "runs" / preset / f"{method}-s{SEED}" / "audit" / "summary.json").exists()
    ]
    if not rows:
        print("no finished pilot yet", file=sys.stderr)
        return 0
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "pilots.csv", index=False, float_format="%.4f")
    lines = markdown(frame)
    print("\n".join(lines))
    if args.report is not None:
        replace_block(args.report, lines, BEGIN, END)
    return 0


def report_charges(run: Path, report: Path | None) -> int:
    """``--charges``: print (and with ``report`` write) :func:`charge_window`'s table for ``run``."""
    from falcon_cli.sampling.batch_log import read_batch_log

    log_path = run / "batches.parquet"
    if not log_path.exists():
        print(f"scheduler_pilots: {log_path} does not exist: --charges needs a finished FALCON run", file=sys.stderr)
        return 2
    lines = charge_markdown(charge_window(read_batch_log(log_path)), run)
    print("\n".join(lines))
    if report is not None:
        replace_block(report, lines, CHARGE_BEGIN, CHARGE_END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
