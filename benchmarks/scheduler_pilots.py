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
``--keep-rows CSV`` keeps an earlier pilots.csv's rows whose runs OUT does not hold (rebuilt on a machine that lost
them), a finished run's row replacing its old one; a pilot it holds is not trained again.

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
from benchmarks.scheduler_bandit import publish  # noqa: E402
from benchmarks.scheduler_sweep import epoch_rows  # noqa: E402
from benchmarks.shapes_sweep import Variant, collect  # noqa: E402
from falcon_cli.sampling.quantile import QUANTILE_SCALES  # noqa: E402

BEGIN, END = "<!-- scheduler-pilots:begin -->", "<!-- scheduler-pilots:end -->"
CHARGE_BEGIN, CHARGE_END = "<!-- charge-window:begin -->", "<!-- charge-window:end -->"
CHARGES = (0.1, 0.25, 0.5, 0.6, 0.75, 1.0, 2.0)
"""The charges of a false pick :func:`charge_window` tries (candidate B's recipes charge 2)."""
GRID = tuple(round(0.05 * k, 2) for k in range(21))
"""The q's ``--charges RUN --embeddings-epoch E`` tries: 0, 0.05, …, 1."""
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


def best_density_policy(false, levels, density, charges=CHARGES, *, bins: int = 10):
    """What candidate B's reward asks of the best learner that knew each anchor's false-negative density.

    ``false`` ``[rows, L]``: whether each row's pick at each of the q ``levels`` ``[L]`` would be a false negative;
    ``density`` ``[rows]``: its anchor's false-negative density. For each charge w the rows are split into ``bins``
    quantiles of density; each bin takes the level with the highest mean worth (1 − f)·q − w·f (B's worth with a
    perfect judge, a pick's rank on the chain's scale taken as its q; ties go to the easier q). The choices give the
    chain's false-negative rate, corr(q, density) and the mean q, and the pilots' `dense` criterion is applied to
    them. In-sample and limited to the levels given: what the reward rewards, not what a scheduler reaches."""
    import numpy as np
    import pandas as pd
    import torch

    from falcon_cli.sampling.scheduler import judged_worth

    false = np.asarray(false, dtype=np.float64)
    levels = np.asarray(levels, dtype=np.float64)
    density = np.asarray(density, dtype=np.float64)
    group = pd.qcut(density, bins, labels=False, duplicates="drop")
    rows = []
    for w in charges:
        chosen = np.empty(len(density))
        chosen_false = np.empty(len(density))
        for g in np.unique(group):
            inside = group == g
            picks = torch.from_numpy(false[inside])
            worth = judged_worth(torch.from_numpy(levels).expand_as(picks), picks, w).mean(0)
            best = int(worth.argmax())
            chosen[inside], chosen_false[inside] = levels[best], false[inside, best]
        corr = float(np.corrcoef(chosen, density)[0, 1]) if chosen.std() > 0 else float("nan")
        row = {"charge": w, "chain_fn_rate": float(chosen_false.mean()), "q_fn_density_corr": corr,
               "q_mean": float(chosen.mean())}  # fmt: skip
        row["passes"] = passes("dense", row)
        rows.append(row)
    return pd.DataFrame(rows)


def charge_window(log, charges=CHARGES, *, last_epochs: int = 3, bins: int = 10):
    """:func:`best_density_policy` from a run's batch log: its chained slots in the last ``last_epochs`` epochs, the
    five fixed q's every batch logs (:data:`~falcon_cli.sampling.composers.FIXED_Q_LEVELS`; the ``fn_at_q*`` fields
    say whether that q's pick, among the anchor's remaining candidates, would be false) on the chain's scale."""
    from falcon_cli.sampling.composers import FIXED_Q_FIELDS, FIXED_Q_LEVELS

    chained = log[log["q"].notna() & log["anchor_fn_density"].notna()]
    chained = chained[chained["epoch"] > int(chained["epoch"].max()) - last_epochs]
    false = chained[list(FIXED_Q_FIELDS)].to_numpy()
    return best_density_policy(false, FIXED_Q_LEVELS, chained["anchor_fn_density"].to_numpy(), charges, bins=bins)


def space_counterfactuals(image, text, truth, width: int, levels, scale: str, *, seed: int = 0):
    """Every anchor's pick at each of ``levels`` on ``scale`` among all the other pairs of its space (spaces of
    ``width``, the composer's order: ascending unified similarity), and whether it is false, with the anchor's
    false-negative density: ``(false [N, L] bool, density [N])``. From a run's embeddings and its world's oracle
    (:func:`benchmarks.scheduler_bandit.shapes_run_world`), at any grid of q, where a batch log holds five."""
    import numpy as np
    import torch

    from benchmarks.scheduler_bandit import full_spaces, space_false_negatives
    from falcon_cli.sampling.quantile import quantile_position, space_tables

    n = width - 1
    position = torch.as_tensor(quantile_position(np.asarray(levels, dtype=np.float64), n, scale)).long()
    false, density = [], []
    for members in full_spaces(len(image), width, seed):
        fn = space_false_negatives(truth, members)
        order = space_tables(image[members][None], text[members][None], torch.tensor([width])).order[0, :, :n].long()
        false.append(fn.gather(1, order[:, position]))  # [W, L]
        density.append(fn.float().sum(1) / n)
    return torch.cat(false).numpy(), torch.cat(density).numpy()


def charge_markdown(frame, header: str) -> list[str]:
    """A ``--charges`` block under ``header`` (how it was made): per charge, what its best density-aware learner
    gives and the dense verdict."""
    lines = [
        header,
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
    parser.add_argument(
        "--embeddings-epoch", type=int, metavar="E",
        help="--charges from RUN's embeddings of epoch E and its world's oracle, on a 21-q grid (any run)",
    )  # fmt: skip
    parser.add_argument("--scale", choices=QUANTILE_SCALES, default="log_rank", help="with --embeddings-epoch")
    parser.add_argument("--width", type=int, default=500, help="with --embeddings-epoch: |M| (the testbed's 500)")
    parser.add_argument("--reuse", type=Path, help="an earlier sweep's OUT whose worlds and encoders to link")
    parser.add_argument("--budget", default="cpu", help="phase_sweep's budget (quick: a smoke test of the chain)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--collect", action="store_true", help="train nothing: only the table")
    parser.add_argument("--report", type=Path)
    parser.add_argument(
        "--keep-rows", type=Path, metavar="CSV",
        help="an earlier pilots.csv: its rows whose runs are not in OUT stay in the table (runs lost with a machine), "
        "and its pilots are not trained again",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.charges is not None:
        return report_charges(args.charges, args.report, args.embeddings_epoch, args.scale, args.width)
    if args.out is None:
        parser.error("--out is required (or --charges RUN)")

    try:  # (read before any training: a wrong path is said now, not after hours)
        kept = {(r["preset"], r["method"]) for r in kept_rows([], args.keep_rows)} if args.keep_rows else set()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.reuse is not None:
        link_reused(out, args.reuse.resolve())
    for preset in [] if args.collect else args.presets:
        # a pilot the kept table records is not trained again (its row stands for its run, gone with a machine)
        left = [m for m in args.only or PILOTS if (preset, m) not in kept]
        if not left:
            print(f"every pilot asked for in {preset} is in {args.keep_rows}", flush=True)
            continue
        epochs = [] if args.budget == "quick" else ["--set", f"epochs={EPOCHS}"]
        command = [sys.executable, str(REPO / "benchmarks" / "phase_sweep.py"), "--out", str(out), "--budget",
                   args.budget, *epochs, "--presets", preset, "--seeds", str(SEED), "--only", *left,
                   "--jobs", str(args.jobs)] + (["--threads", str(args.threads)] if args.threads else [])  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run(command, check=True, cwd=REPO, env=env)
    rows = [
        pilot_row(preset, method, out / "runs" / preset / f"{method}-s{SEED}")
        for preset in args.presets
        for method in args.only or PILOTS + FOLLOW_UPS  # (the table: every finished pilot, follow-ups too)
        if (out / "runs" / preset / f"{method}-s{SEED}" / "audit" / "summary.json").exists()
    ]
    if args.keep_rows is not None:
        rows = kept_rows(rows, args.keep_rows)  # (checked above)
    if not rows:
        print("no finished pilot yet", file=sys.stderr)
        return 0
    frame = pd.DataFrame(rows)
    publish(frame, markdown(frame), out=out, csv="pilots.csv", report=args.report, begin=BEGIN, end=END)
    return 0


def kept_rows(rows: list[dict], earlier: Path) -> list[dict]:
    """``rows`` with an earlier table's rows of the pilots they lack, in the table's order (world, then the pilots'
    and follow-ups' order): ``--keep-rows``, for a table rebuilt where some runs no longer are. A row of ``rows``
    replaces the earlier one of the same world and candidate."""
    import pandas as pd

    if not earlier.is_file():
        raise ValueError(f"scheduler_pilots: --keep-rows {earlier}: no such file (an earlier run's pilots.csv)")
    frame = pd.read_csv(earlier)
    missing = {"preset", "method"} - set(frame.columns)
    if missing:
        raise ValueError(
            f"scheduler_pilots: --keep-rows {earlier}: no {', '.join(sorted(missing))} column: not a pilots.csv"
        )
    have = {(row["preset"], row["method"]) for row in rows}
    old = [row for row in frame.to_dict("records") if (row["preset"], row["method"]) not in have]
    for row in old:
        row["passes"] = bool(row["passes"])
    order = {name: i for i, name in enumerate(PILOTS + FOLLOW_UPS)}
    return sorted(rows + old, key=lambda r: (PRESETS.index(r["preset"]), order.get(r["method"], len(order))))


def report_charges(run: Path, report: Path | None, epoch: int | None, scale: str, width: int) -> int:
    """``--charges RUN``: :func:`charge_window` of the run's batch log or, with ``epoch``, :func:`best_density_policy`
    over :func:`space_counterfactuals` of its embeddings of that epoch on ``scale`` (spaces of ``width``, q on
    :data:`GRID`); printed, and with ``report`` written between ``charge-window:begin`` / ``:end`` (or
    ``charge-grid-SCALE:begin`` / ``:end``, a block per scale)."""
    command = f"PYTHONPATH=. .venv/bin/python benchmarks/scheduler_pilots.py --charges {run}"
    if epoch is None:
        from falcon_cli.sampling.batch_log import read_batch_log

        source = run / "batches.parquet"
        if not source.exists():
            print(f"scheduler_pilots: {source} does not exist: --charges needs a finished FALCON run", file=sys.stderr)
            return 2
        frame = charge_window(read_batch_log(source))
        header = (
            f"Generated by `{command} --report docs/results.md`: the run's chained picks in its last 3 epochs, anchors "
            "in 10 quantiles of their false-negative density, each quantile at its best of q ∈ {0, 0.25, 0.5, 0.75, 1} "
            "under (1 − f)·q − w·f."
        )
        begin, end = CHARGE_BEGIN, CHARGE_END
    else:
        from benchmarks.scheduler_bandit import shapes_run_world

        source = run / "embeddings" / f"epoch_{epoch:03d}.h5"
        if not source.exists():
            print(f"scheduler_pilots: {source} does not exist: pass an epoch the run embedded (ls {run}/embeddings)",
                  file=sys.stderr)  # fmt: skip
            return 2
        image, text, truth = shapes_run_world(run, epoch)
        false, density = space_counterfactuals(image, text, truth, width, GRID, scale)
        frame = best_density_policy(false, GRID, density)
        header = (
            f"`{scale}`, epoch {epoch}: generated by `{command} --embeddings-epoch {epoch} --scale {scale} --report "
            f"docs/results.md`: {len(density):,} anchors in spaces of {width}, each pick among all the other pairs of "
            "its space, q ∈ {0, 0.05, …, 1}."
        )
        begin, end = f"<!-- charge-grid-{scale}:begin -->", f"<!-- charge-grid-{scale}:end -->"
    publish(frame, charge_markdown(frame, header), out=None, csv="", report=report, begin=begin, end=end)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
