"""What MAFA's connection discriminator decided in a finished run, every decision scored against the oracle.

    PYTHONPATH=. .venv/bin/python benchmarks/mafa_decisions.py runs/fair-dense/runs/dense/mafa-rule-s0 \\
        --out runs/fair-dense/mafa-decisions/s0                      # every step: about 20 CPU minutes at one thread

A MAFA run makes two decisions per anchor, both on the anchor's hardest in-batch candidate by ITC similarity, from
its Con-D's p(match) (docs/methods.md): above ``high`` the candidate becomes a positive (a *conversion*); between
``low`` and ``high`` it is ambiguous and ITM takes the second-hardest candidate instead (a *swap*). The run logs how
many of each it made on its logged steps (``fn_converted_*``, ``fn_swapped_*``) and scores its conversions against
the oracle (``kind: false_negatives``); its swaps it does not score. This script replays both decisions and scores
them:

1. **The replay.** ``falcon audit-false-negatives`` with the run's own judge (its config's
   ``pretrain.false_negatives.mafa`` judge and model) on the run's ``itm`` negatives: each anchor's hardest in-batch
   candidate from the run's embedding cache, which training filled from the very step's forward (the function the
   step calls). It runs on a view of the run under ``--out`` (links to the run's batch log, cache and checkpoints),
   so the run's own audit is kept.
2. **The check**, before any number is read: on every step the run logged, the replayed conversions and swaps
   equal the logged counts, per direction. Any difference stops the script (exit 1): the replay would not be the
   run's decisions.
3. **The scores**: per decision and direction, how many (and the share of anchors), precision against the oracle,
   recall of the candidates' false negatives; the candidates' false-negative rate; Con-D's AUC on them (false
   negatives against true) and its mean p(match) for each; the swaps by caption specificity.

Writes ``--out/decisions.json``; the replay's audit stays in ``--out/view/audit/`` (kept between calls: delete it
to replay again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falcon_cli.sampling.oracle_view import rank_auc  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DIRECTIONS = ("i2t", "t2i")
LINKED = ("batches.parquet", "embeddings", "checkpoints", "data", "results", "unimodal")
"""The run's parts the view links to (large, read only); its small files are copied, as the audit rewrites them."""


class ReplayMismatch(RuntimeError):
    """The replayed decisions differ from the run's logged counts on some step."""


def mafa_settings(config: dict, run: Path) -> dict:
    """The run's MAFA settings (judge, judge_model, high, low) from its resolved ``config.yaml``; one line if the run
    is not a MAFA run."""
    fn = (config.get("pretrain") or {}).get("false_negatives") or {}
    if fn.get("method") != "mafa":
        raise SystemExit(
            f"{run}/config.yaml: pretrain.false_negatives.method is {fn.get('method')!r}, not 'mafa'; "
            "give a MAFA run directory"
        )
    m = fn.get("mafa") or {}
    return {
        "judge": m.get("judge", "checkpoint"),
        "judge_model": m.get("judge_model"),
        "high": m["high"],
        "low": m["low"],
    }


def decisions(score: np.ndarray, high: float, low: float) -> tuple[np.ndarray, np.ndarray]:
    """(converted, swapped) of candidates with Con-D p(match) ``score``, compared in float32 as the step compares
    them: converted when p > high, swapped when low < p < high (:func:`~falcon_cli.objectives.mafa.connection_mining`;
    a batch of two has no second-hardest candidate to swap in, which the fair runs' batches of 64 never are)."""
    p = np.asarray(score, dtype=np.float32)
    return p > np.float32(high), (p > np.float32(low)) & (p < np.float32(high))


def logged_counts(metrics: list[dict]) -> pd.DataFrame:
    """The run's logged conversions and swaps, per 0-based training step (a record's ``step`` counts the steps
    done, this one included)."""
    rows = [r for r in metrics if "fn_swapped_i2t" in r and "loss" in r]
    keys = [f"fn_{what}_{d}" for what in ("converted", "swapped") for d in DIRECTIONS]
    return pd.DataFrame([{"train_step": r["step"] - 1, **{k: int(r[k]) for k in keys}} for r in rows]).set_index(
        "train_step"
    )


def replayed_counts(audit: pd.DataFrame, high: float, low: float) -> pd.DataFrame:
    """The replay's conversions and swaps per 0-based training step, rank 0's anchors only (the rank that logs)."""
    ranks = int(audit["rank"].nunique())
    own = audit[audit["rank"] == 0]
    converted, swapped = decisions(own["score"].to_numpy(), high, low)
    frame = pd.DataFrame(
        {"train_step": own["train_step"].to_numpy() // ranks, "direction": own["direction"].to_numpy()}
    ).assign(converted=converted, swapped=swapped)
    counts = frame.groupby(["train_step", "direction"])[["converted", "swapped"]].sum().unstack("direction")
    out = pd.DataFrame(index=counts.index)
    for what in ("converted", "swapped"):
        for d in DIRECTIONS:
            out[f"fn_{what}_{d}"] = counts[(what, d)].astype(int) if (what, d) in counts.columns else 0
    return out


def check_replay(logged: pd.DataFrame, replayed: pd.DataFrame) -> int:
    """The number of logged steps the replay covers, after checking that it reproduces every one of them exactly;
    :class:`ReplayMismatch` naming the first step that differs, or when it covers none."""
    common = logged.index.intersection(replayed.index)
    if len(common) == 0:
        raise ReplayMismatch("the replay audited none of the steps the run logged; rerun with --max-pairs 0")
    diff = (logged.loc[common] != replayed.loc[common, logged.columns]).any(axis=1)
    if diff.any():
        step = int(diff[diff].index[0])
        raise ReplayMismatch(
            f"step {step}: the run logged {logged.loc[step].to_dict()}, the replay gives "
            f"{replayed.loc[step, logged.columns].to_dict()} ({int(diff.sum())} of {len(common)} logged steps differ)"
        )
    return len(common)


def decision_scores(flag: np.ndarray, truth: np.ndarray) -> dict:
    """How many candidates a decision took, their share, precision against the oracle, recall of its false
    negatives (None where undefined)."""
    flag, truth = np.asarray(flag, bool), np.asarray(truth, bool)
    hits = int((flag & truth).sum())
    return {
        "count": int(flag.sum()),
        "share": float(flag.mean()) if len(flag) else None,
        "precision": hits / int(flag.sum()) if flag.any() else None,
        "recall": hits / int(truth.sum()) if truth.any() else None,
    }


def score_decisions(audit: pd.DataFrame, high: float, low: float) -> dict:
    """Every replayed decision against the oracle (the audit's ``oracle`` column), pooled and per direction."""
    if "oracle" not in audit.columns:
        raise SystemExit("the replay's audit has no oracle column: its world has no ground truth to score against")
    result = {}
    for name, part in [("both", audit)] + [(d, audit[audit["direction"] == d]) for d in DIRECTIONS]:
        truth, score = part["oracle"].to_numpy(bool), part["score"].to_numpy(np.float64)
        converted, swapped = decisions(score, high, low)
        both = truth.any() and (~truth).any()
        result[name] = {
            "candidates": len(part),
            "false_negative_rate": float(truth.mean()) if len(part) else None,
            "converted": decision_scores(converted, truth),
            "swapped": decision_scores(swapped, truth),
            "auc": rank_auc(score, truth) if both else None,
            "mean_p_false": float(score[truth].mean()) if truth.any() else None,
            "mean_p_true": float(score[~truth].mean()) if (~truth).any() else None,
            "max_p": float(score.max()) if len(part) else None,
        }
    if "caption_specificity" in audit.columns:
        _, swapped = decisions(audit["score"].to_numpy(), high, low)
        by = audit.assign(swapped=swapped, hit=swapped & audit["oracle"].to_numpy(bool))
        table = by.groupby("caption_specificity").agg(
            candidates=("swapped", "size"),
            false_negatives=("oracle", "sum"),
            swapped=("swapped", "sum"),
            true_hits=("hit", "sum"),
        )
        result["swapped_by_specificity"] = [
            {"specificity": int(k), **{c: int(v) for c, v in row.items()}} for k, row in table.iterrows()
        ]
    return result


def make_view(run: Path, view: Path) -> None:
    """``view``: the run's large parts linked, its small files copied (the audit rewrites its config, manifest and
    log, which the run keeps as they are); no ``audit/``."""
    view.mkdir(parents=True, exist_ok=True)
    for entry in run.iterdir():
        target = view / entry.name
        if entry.name == "audit" or target.exists() or target.is_symlink():
            continue
        if entry.name in LINKED or entry.is_dir():
            target.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
        else:
            shutil.copy2(entry, target)


def replay(run: Path, view: Path, settings: dict, max_pairs: int, device: str) -> pd.DataFrame:
    """The run's ITM candidates judged by its own Con-D (``falcon audit-false-negatives`` on ``view``), threshold
    ``low``; reused when the view already holds one."""
    parquet, source = view / "audit" / "audit.parquet", view.parent / "replay_of.json"
    wanted = {"run": str(run.resolve()), **settings, "max_pairs": max_pairs}
    if source.exists() and json.loads(source.read_text()) != wanted:
        raise SystemExit(
            f"--out {view.parent}: holds the replay of {json.loads(source.read_text())['run']} at other settings; "
            "give another --out, or delete that one"
        )
    if not parquet.exists():
        from falcon_cli.artifacts.atomic import write_json

        make_view(run, view)
        write_json(source, wanted)
        command = [sys.executable, "-m", "falcon_cli", "audit-false-negatives", str(view), "--judge", settings["judge"]]
        if settings["judge_model"]:
            command += ["--judge-model", str(settings["judge_model"])]
        command += ["--negatives", "itm", "--threshold", str(settings["low"]), "--max-pairs", str(max_pairs)]
        command += ["--device", device]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        print("replaying:", " ".join(command[2:]), flush=True)
        proc = subprocess.run(command, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{run}: the replay's audit failed (exit {proc.returncode}); its message is above")
    else:
        print(f"reusing the replay in {parquet} (delete it to replay again)")
    return pd.read_parquet(parquet)


def main(argv: list[str] | None = None) -> dict:
    import yaml

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="A finished MAFA run directory (its batch log and embedding cache).")
    parser.add_argument("--out", type=Path, required=True, help="Where the replay's view and decisions.json go.")
    parser.add_argument(
        "--max-pairs", type=int, default=0, help="Judge at most this many candidates, whole steps (0 = every step)."
    )
    parser.add_argument("--device", default="cpu", help="Con-D's device: cpu, cuda[:n] or auto.")
    args = parser.parse_args(argv)
    run = args.run
    if not (run / "config.yaml").exists():
        raise SystemExit(f"{run}: not a run directory (no config.yaml); give a finished MAFA run")
    for needed in ("metrics.jsonl", "batches.parquet", "embeddings"):
        if not (run / needed).exists():
            raise SystemExit(f"{run}: no {needed}; the replay needs a finished run's batch log and embedding cache")
    settings = mafa_settings(yaml.safe_load((run / "config.yaml").read_text()), run)
    if args.out.resolve() == run.resolve() or run.resolve() in args.out.resolve().parents:
        raise SystemExit(f"--out {args.out}: inside the run; give a directory outside it (the run stays untouched)")

    audit = replay(run, args.out / "view", settings, args.max_pairs, args.device)
    from falcon_cli.runtime.metrics import read_metrics

    logged = logged_counts(read_metrics(run / "metrics.jsonl"))
    try:
        checked = check_replay(logged, replayed_counts(audit, settings["high"], settings["low"]))
    except ReplayMismatch as error:
        print(f"{run}: the replay is not the run's decisions: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    result = {
        "run": str(run),
        **settings,
        "steps_replayed": int(audit["train_step"].nunique()),
        "logged_steps_checked": checked,
        **score_decisions(audit, settings["high"], settings["low"]),
    }
    from falcon_cli.artifacts.atomic import write_json

    write_json(args.out / "decisions.json", result)
    both = result["both"]

    def pct(x):
        return "—" if x is None else f"{100 * x:.1f}%"

    print(
        f"{run}: {both['candidates']:,} hardest candidates over {result['steps_replayed']} steps; the replay gives "
        f"the run's logged counts on all {checked} logged steps"
    )
    print(
        f"  false negatives among them {pct(both['false_negative_rate'])}; Con-D p(match) mean "
        f"{both['mean_p_false']:.3f} on them, {both['mean_p_true']:.3f} on true negatives (AUC {both['auc']:.3f}), "
        f"max {both['max_p']:.3f}"
    )
    for what, bound in (
        ("converted", f"p > {settings['high']:g}"),
        ("swapped", f"{settings['low']:g} < p < {settings['high']:g}"),
    ):
        s = both[what]
        print(
            f"  {what} ({bound}): {s['count']:,} ({pct(s['share'])} of anchors), precision {pct(s['precision'])}, "
            f"recall {pct(s['recall'])}"
            + "".join(
                f"; {d} {result[d][what]['count']:,} at precision {pct(result[d][what]['precision'])}"
                for d in DIRECTIONS
            )
        )
    print(f"written: {args.out / 'decisions.json'}")
    return result


if __name__ == "__main__":
    main()
