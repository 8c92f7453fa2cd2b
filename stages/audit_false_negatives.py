"""The audit-false-negatives stage: judge the negatives a run actually used (the paper's Figure 2).

Reads top to bottom:
1. inputs, all checked before any judging: the run's batch log, its dataset (each pair's image
   and the caption the run saw in each epoch), the per-epoch embedding caches (for the ITM
   negatives), the judge (the shapes oracle, BLIP, or a falcon checkpoint's ITM head) and,
   on the shapes world, the oracle as the ground truth;
2. the negatives the run used: the chain neighbours a composer chose at quantile q and each
   anchor's hardest in-batch ITM negative, both directions, over whole training steps evenly
   spread within the ``max_pairs`` / ``steps`` budget;
3. the judge's verdict on each (plus the oracle's, and the caption's specificity);
4. the tables: false-negative rate by hardness and step window, what is left after filtering
   by the judge's score at each threshold, the judge against the oracle, and (with an oracle) how
   often the final model's top-1 / top-10 / median candidate of a search space is a true match;
   on a world with near-miss families, how often a batch row has a sibling scene in its batch;
5. ``audit/`` written whole (a failed audit leaves the previous one untouched): audit.parquet,
   audit.md, the CSV tables, summary.json and the figures; a printed summary; the manifest.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rich.markup import escape
from rich.table import Table

from falcon_cli.artifacts.atomic import atomic_dir, write_json, write_text
from falcon_cli.artifacts.embeddings import check_fingerprint, read_embeddings
from falcon_cli.artifacts.tables import AUDIT, write_table
from falcon_cli.audit import report
from falcon_cli.audit.candidates import oracle_candidate_risk
from falcon_cli.audit.near_misses import near_miss_share
from falcon_cli.audit.negatives import false_negative_rates, judge_negatives, used_negatives
from falcon_cli.config.schema import Recipe
from falcon_cli.data.datasets import pretrain_dataset
from falcon_cli.data.pairs import records_fingerprint
from falcon_cli.data.shapes.near_misses import family_size
from falcon_cli.data.shared_images import SharedImages
from falcon_cli.data.spec import load_spec
from falcon_cli.errors import FalconError
from falcon_cli.judges import load_judge
from falcon_cli.judges.oracle import OracleJudge
from falcon_cli.judges.pairs import DatasetPairs
from falcon_cli.objectives.false_negative_builder import excluded_negatives
from falcon_cli.reporting import audit_figures
from falcon_cli.runtime.console import make_console
from falcon_cli.runtime.distributed import on_rank_zero
from falcon_cli.runtime.loggers import RunLoggers
from falcon_cli.runtime.metrics import read_metrics
from falcon_cli.runtime.run_dir import RunDirectory
from falcon_cli.sampling.batch_log import read_batch_log
from falcon_cli.sampling.oracle_view import summary_by_epoch

console = make_console(stderr=True)

OUTPUT = Path("audit")
SUMMARY = "summary.json"


def run(config: Recipe, run: RunDirectory) -> dict:
    """Audit the run's negatives (rank 0 works, other ranks wait); returns the manifest summary."""
    return on_rank_zero(lambda: _audit(config, run))


def _audit(config: Recipe, run: RunDirectory) -> dict:
    a = config.audit
    started = time.perf_counter()

    # 1. Inputs. The batch log says which pairs met in which batch; the dataset says what they are.
    log_path = run.path / "batches.parquet"
    if not log_path.exists():
        raise FalconError(
            f"{log_path}: not found; audit a run whose pretrain stage has finished (it writes the batch log)"
        )
    log = read_batch_log(log_path)
    # The figures also go to the pretraining run's loggers (TensorBoard, wandb, MLflow), their packages checked now.
    loggers = RunLoggers(
        config.pretrain.logging.loggers, run.path / "loggers", what="pretrain.logging.loggers", name=run.path.name
    )
    spec = load_spec(config.data.dataset)
    world = spec.resolve(spec.shapes_world) if spec.shapes_world is not None else None
    kind = a.judge if a.judge != "auto" else ("oracle" if world is not None else "blip")
    if kind == "oracle" and world is None:
        raise FalconError(
            f"audit.judge=oracle: {config.data.dataset} is not a shapes world (no shapes_world in its "
            "dataset.yaml), so it has no oracle; use --judge blip or --judge checkpoint"
        )
    dataset = pretrain_dataset(spec, transform=None, on_missing=config.data.on_missing, seed=config.seed)
    pair_at = DatasetPairs(dataset)
    shared = SharedImages(dataset.records)  # pairs that show one image: false negatives by construction

    fingerprint = records_fingerprint(dataset.records, spec.base_dir)

    def features(epoch: int):
        path = run.path / "embeddings" / f"epoch_{epoch:03d}.h5"
        if not path.exists():
            raise FalconError(
                f"{path}: not found; the ITM negatives of epoch {epoch} need the epoch's embedding cache "
                "(pretrain writes it at the end of each epoch); audit only the chain negatives with --negatives chain"
            )
        embeddings = read_embeddings(path)
        # (features of another dataset would pair the log's ids with the wrong pairs: refused, like every reader)
        warning = check_fingerprint(path, embeddings.attrs, fingerprint, config.data.dataset)
        if warning is not None:
            console.print(f"[yellow]warning:[/] {escape(warning)}")
        return embeddings

    judge = load_judge(
        kind,
        model=a.judge_model,
        world=world,
        run=a.judge_model or run.path,
        device=a.device,
        fp16=a.fp16,
        batch_size=a.batch_size,
        what="audit.judge_model",
    )
    oracle = None
    if world is not None:  # the ground truth, wherever the data has one
        oracle = judge if isinstance(judge, OracleJudge) else OracleJudge(world)

    # 2. The negatives the run used, over whole steps evenly spread within the budget.
    negatives = used_negatives(
        log,
        kinds=a.negatives,
        features=features,
        max_pairs=a.max_pairs,
        max_steps=a.steps,
        same_image=excluded_negatives(config.pretrain.false_negatives, spec, dataset.records, itm=True),
    )
    if negatives.empty:
        raise FalconError(
            f"{log_path}: no {' or '.join(a.negatives)} negatives to audit (uniform batches have no chain "
            "negatives: add itm to audit.negatives; or raise audit.max_pairs)"
        )

    # 3. The judge's verdict, the oracle's, and how specific each judged caption is.
    audit = judge_negatives(negatives, pair_at, judge, threshold=a.threshold, oracle=oracle)
    specificity = pd.array([None] * len(audit), dtype="Int64")
    if oracle is not None:
        caption_ids = [pair_at(int(e), int(c)).caption_id for e, c in zip(audit["epoch"], audit["caption_pair"])]
        specificity = pd.array(oracle.oracle.specificity(caption_ids), dtype="Int64")
    audit["caption_specificity"] = specificity

    # 4. The tables.
    truth = report.truth_column(audit)
    # (copies: pandas hands out read-only arrays, which torch.as_tensor warns about on every audit)
    same_image = (
        shared.images(torch.as_tensor(audit["image_pair"].to_numpy(copy=True)))
        == shared.images(torch.as_tensor(audit["caption_pair"].to_numpy(copy=True)))
    ).numpy()
    overall = report.overall_rates(audit, same_image)
    rates = false_negative_rates(audit, hardness_buckets=a.hardness_buckets, step_windows=a.step_windows)
    windows = false_negative_rates(audit, hardness_buckets=None, step_windows=a.step_windows)
    curve = report.filter_curve(audit, a.filter_thresholds, truth=truth)
    agreement = report.judge_agreement(audit)
    missed = report.missed_false_negatives(audit, a.examples)
    # The premise under this run's final model: how often its hardest candidates are true matches.
    risk = pd.DataFrame()
    if oracle is not None:
        last = int(log["epoch"].max())
        risk = oracle_candidate_risk(
            features(last),
            pair_at,
            oracle.oracle,
            last,
            space_size=config.pretrain.composer.search_space_size,
            seed=config.seed,
        )
    # How often the composer put near misses together (worlds with near-miss families).
    size = family_size(world) if world is not None else 1
    siblings = pd.DataFrame()
    if size > 1:
        image_of_pair = np.full(max(r.pair_id for r in dataset.records) + 1, -1, dtype=np.int64)
        image_of_pair[[r.pair_id for r in dataset.records]] = [int(r.extra["image_id"]) for r in dataset.records]
        siblings = near_miss_share(log, image_of_pair // size)
    # What the quantile composer chose against the oracle's safe q and FN density (logged per chained slot).
    scheduler = summary_by_epoch(log)
    steps = audit["train_step"]
    notes = []
    if oracle is not None and judge is oracle:
        notes.append(
            "the judge is the oracle itself, so its filter curve and precision/recall are perfect by "
            "construction; audit with --judge checkpoint or --judge blip to see how a model judge does"
        )
    if "itm" in a.negatives and config.pretrain.losses.itm_negatives == "sample":
        notes.append(
            "this run sampled its ITM negatives (itm_negatives: sample); the itm rows are the most likely draw"
        )

    # 5. Write audit/ whole: readers see the previous audit or this one, never a mix.
    summary = {
        "run": str(run.path),
        "judge": judge.name,
        "threshold": a.threshold,
        "truth": truth,
        "negatives": list(a.negatives),
        "pairs": int(len(audit)),
        "steps_audited": int(steps.nunique()),
        "first_step": int(steps.min()),
        "last_step": int(steps.max()),
        "overall": overall.to_dict(orient="records"),
        "by_window": windows.to_dict(orient="records"),
        "judge_vs_oracle": agreement.to_dict(orient="records"),
        "candidate_risk": risk.to_dict(orient="records"),
        "near_misses_in_batch": siblings.to_dict(orient="records"),
        "scheduler_vs_oracle": scheduler.astype(object).where(scheduler.notna(), None).to_dict(orient="records"),
        "seconds": round(time.perf_counter() - started, 2),
    }
    with atomic_dir(run.path / OUTPUT) as out:
        write_table(out / "audit.parquet", audit, AUDIT)
        write_text(out / "fn_rate_by_q.csv", rates.to_csv(index=False))
        write_text(out / "fn_rate_by_step.csv", windows.to_csv(index=False))
        write_text(out / "fn_after_filter.csv", curve.to_csv(index=False))
        write_text(out / "judge_vs_oracle.csv", agreement.to_csv(index=False))
        if not risk.empty:
            write_text(out / "candidate_risk.csv", risk.to_csv(index=False))
        audit_figures.fn_rate_by_q(
            rates, out / "fn_rate_by_q.png", title=f"false negatives by hardness: {run.path.name}"
        )
        audit_figures.fn_after_filter(
            curve,
            out / "fn_after_filter.png",
            judge=judge.name,
            truth="the oracle" if truth == "oracle" else "the judge",
        )
        audit_figures.missed_examples(_examples(missed, pair_at), out / "missed_examples.png")
        if not scheduler.empty:
            write_text(out / "scheduler_vs_oracle.csv", scheduler.to_csv(index=False))
            audit_figures.scheduler_vs_oracle(
                scheduler,
                log[log["epoch"] == scheduler["epoch"].max()],
                out / "scheduler_vs_oracle.png",
                title=run.path.name,
            )
        write_text(
            out / "audit.md",
            report.audit_markdown(
                run=str(run.path),
                judge=judge.name,
                threshold=a.threshold,
                truth=truth,
                steps=(summary["steps_audited"], summary["first_step"], summary["last_step"]),
                overall=overall,
                rates=rates,
                curve=curve,
                agreement=agreement,
                scheduler=scheduler,
                notes=notes,
                candidate_risk=risk,
            ),
        )
        write_json(out / SUMMARY, summary)
    run.add_artifact(
        OUTPUT, schema="audit", schema_version=AUDIT.version, meta={"judge": judge.name, "pairs": len(audit)}
    )
    log_figures(loggers, run)
    _render(summary, overall, agreement)
    return {k: summary[k] for k in ("judge", "pairs", "steps_audited", "overall", "seconds")}


def log_figures(loggers: RunLoggers, run: RunDirectory) -> None:
    """The audit's figures as images in the pretraining run's loggers (``audit/<figure>``), at its last step."""
    if not loggers:
        return
    metrics = run.path / "metrics.jsonl"
    step = max((r.get("step", 0) for r in read_metrics(metrics)), default=0) if metrics.exists() else 0
    loggers.open(step)  # (continues the run's wandb and MLflow runs; TensorBoard appends)
    for figure in sorted((run.path / OUTPUT).glob("*.png")):
        loggers.image(f"{OUTPUT.name}/{figure.stem}", figure, step)
    loggers.close()


def _examples(missed: pd.DataFrame, pair_at) -> list[dict]:
    """The missed false negatives as the figure wants them: both pairs, and the judged one."""
    examples = []
    for row in missed.itertuples():
        anchor, negative = pair_at(row.epoch, row.anchor), pair_at(row.epoch, row.negative)
        examples.append(
            {
                "direction": row.direction,
                "score": float(row.score),
                "anchor_image": anchor.image,
                "anchor_caption": anchor.caption,
                "negative_image": negative.image,
                "negative_caption": negative.caption,
                "judged_image": pair_at(row.epoch, row.image_pair).image,
                "judged_caption": pair_at(row.epoch, row.caption_pair).caption,
            }
        )
    return examples


def _render(summary: dict, overall: pd.DataFrame, agreement: pd.DataFrame) -> None:
    table = Table(
        title=escape(
            f"false negatives of the used negatives: {summary['run']} ({summary['pairs']} judged, "
            f"{summary['steps_audited']} steps, judge {summary['judge']})"
        )
    )
    with_oracle = "oracle_rate" in overall.columns
    for column in ["negatives", "kind", "judge: false negatives"] + (
        ["oracle: false negatives"] if with_oracle else []
    ):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for row in overall.to_dict(orient="records"):
        cells = [str(row["negatives"]), row["kind"], f"{row['false_negatives']} ({100 * row['rate']:.1f}%)"]
        if with_oracle:
            cells.append(f"{row['oracle_false_negatives']} ({100 * row['oracle_rate']:.1f}%)")
        table.add_row(*cells)
    console.print(table)
    if not agreement.empty:
        row = agreement.iloc[0]
        console.print(
            f"judge vs oracle: precision {_pct(row['precision'])}, recall {_pct(row['recall'])}, F1 {_pct(row['f1'])}, "
            f"AUC {row['auc']:.2f} (the judge's score ranking false negatives above true negatives)"
        )


def _pct(value) -> str:
    return "-" if pd.isna(value) else f"{100 * float(value):.1f}%"
