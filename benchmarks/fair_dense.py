"""A fair comparison where false negatives are dense: every false-negative method at settings derived from its paper
by a written rule, one difference per arm, its decisions scored against the oracle, paired seeds (issue 67).

    # everything, in order, resumable (a finished part of a run is skipped; an interrupted run resumes):
    PYTHONPATH=. .venv/bin/python benchmarks/fair_dense.py --out runs/fair-dense --jobs 2 --threads 1
    # the page's block, the rows and the figures from the finished runs (and the ledger's H200 rows):
    PYTHONPATH=. .venv/bin/python benchmarks/fair_dense.py --out runs/fair-dense --collect --report docs/results.md

The arms, all on the CPU in fp32 (a method arm trained there differs from the ledger's H200 bf16 runs in a second
thing, the device, so it is compared with uniform trained here), each on the `dense` world and budget of
``benchmarks/phase_sweep.py`` (``cpu``), from the same unimodal encoders, seeds 0-4:

* ``uniform-cpu``: uniform batches, GRIT's ITC consistency term at 0.2 (the ledger's ``uniform``, here);
* ``uniform-c0``: the control, uniform without the consistency term (weight 0): the base every false-negative
  method drops the term from, so that each method's arm differs from it in its mechanism alone;
* ``glofnd-rule``, ``mafa-rule``, ``srcl-rule``, ``diht-rule``: each method on uniform batches at its settings by
  rule (:mod:`falcon_cli.method_rules`), its one tuned setting chosen on the tuning world; MAFA's Con-D and SRCL's
  auxiliary model are the same seed's ``uniform-cpu`` run;
* ``uniform-oracle-itc``: every false negative the oracle knows kept out of the ITC alone (``pretrain.
  oracle_negatives: mask_itc``): the ceiling of a method that changes only the ITC (the ledger's ``uniform-oracle``
  masks ITM's mining too, MAFA's ceiling).

The tuning runs go first, in their own ``--tune-out`` (the tuning world: the same preset generated with world seed
:data:`~falcon_cli.method_rules.TUNING_WORLD_SEED`, its own unimodal encoders): per method, each of its (at most two)
candidate values once, seed 0, beside that world's ``uniform-cpu`` seed 0 (MAFA's and SRCL's model). The value with
the higher FN-aware ITC R@1 on that world's test split is kept (``tuning.json``); nothing is chosen on the
evaluation world. A tuning run recorded in docs/results/dense_tuning.csv (:data:`TUNING_LEDGER`) is not run again; its
row stands for its directory. So does an evaluation run recorded in docs/results/fair_dense_results.csv (:data:`LEDGER`,
or ``--ledger``'s, read while it is among ``--rows``), unless a run still to train reads its directory
(:func:`eval_plan`): on a new machine the campaign trains only what the page does not have yet.

Writes to OUT: the runs (``runs/dense/<arm>-s<seed>/``), ``results.csv`` (a row per run), ``flags.csv`` (per run
and epoch: what the method flagged or how it weighted, both directions, against the oracle), ``paired.csv``,
``flags.png``; with ``--report``, the page's block between ``<!-- fair:begin -->`` and ``<!-- fair:end -->``. It reads
MAFA's replayed decisions where ``benchmarks/mafa_decisions.py`` wrote them, ``OUT/mafa-decisions/s<seed>/``
(:func:`decision_rows`), and keeps them in docs/results/fair_dense_mafa_decisions.csv for when they are gone.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from benchmarks.phase_sweep import (
    BUDGETS,
    CPU_ORDER,
    EVALUATED,
    GATE_HEAD_MARGIN,
    ITM_PRIOR,
    PhaseBudget,
    cpu_family,
    generate_world,
    has_checkpoint,
    measurement_changes,
    merge_ledgers,
    prepare,
    retrained_runs,
    run_dir,
    run_one,
    run_row,
)
from benchmarks.shapes_sweep import AUDITED, finished_futures, replace_block
from falcon_cli import method_rules as rules
from falcon_cli.evaluation.intervals import paired_by_seed, paired_ratio

PRESET = "dense"
BASE = "uniform-cpu"
CONTROL = "uniform-c0"
ITC_CEILING = "uniform-oracle-itc"
RULE_ARMS = {"glofnd-rule": "glofnd", "mafa-rule": "mafa", "srcl-rule": "srcl", "diht-rule": "diht"}
"""Arm -> the method (``pretrain.false_negatives.method``) it runs at its settings by rule."""
ARMS = (BASE, CONTROL, *RULE_ARMS, ITC_CEILING)
"""Every arm of the evaluation world, in the order the issue asks for (the base's seeds first: two methods read
them)."""
CEILING = {"glofnd": ITC_CEILING, "srcl": ITC_CEILING, "diht": ITC_CEILING, "mafa": "uniform-oracle"}
"""Each method's ceiling: the oracle arm that masks what the method can act on (MAFA relabels ITM's pairs too, so
its ceiling masks ITC and ITM: the ledger's H200 ``uniform-oracle``, usable only if the device moves uniform by
less than :data:`DEVICE_TOLERANCE`)."""
BASE_OF = {CONTROL: BASE, ITC_CEILING: BASE, "uniform-oracle": "uniform", **dict.fromkeys(RULE_ARMS, CONTROL)}
"""Each arm's base: the arm it differs from in one thing (a method: the control, since every method drops GRIT's
consistency term; an oracle arm: uniform with the term, on its own device)."""
LEDGER = Path("docs/results/fair_dense_results.csv")
"""This sweep's rows as last reported (``--report``): they stand for runs whose directories are gone."""
TUNING_LEDGER = Path(__file__).resolve().parents[1] / "docs" / "results" / "dense_tuning.csv"
"""The tuning runs' results as last reported (this checkout's, wherever the command runs from): a tuning run recorded
here is not run again, and its row stands for its directory when that is gone."""
EVAL_EVERY = 3
"""The learning curve's spacing in epochs (every epoch costs 10% more, and changes no other number)."""
DEVICE_TOLERANCE = 0.5
"""Points of R@1 within which the device's own effect (CPU uniform − H200 uniform, paired by seed: its 95%
interval) must lie before an H200 arm of the ledger stands in for a CPU one."""


CPU_ROW = re.compile(r".+? CPU cores(?:, (.+))? \(cpu, [^)]*\)")
"""A CPU row's ``machine`` (:func:`benchmarks.phase_sweep.machine`), with the CPU's model where the run recorded it."""


def numerics(machine: str) -> str:
    """The kind of machine whose numbers a row's are, from its ``machine`` column
    (:func:`benchmarks.phase_sweep.machine`): a CPU row's :func:`cpu_family`, a GPU row's machine itself; a row
    without one (a ledger from before rows recorded it: CPU runs) is a CPU row that names no model."""
    if not isinstance(machine, str):
        return cpu_family(None)
    cpu = CPU_ROW.fullmatch(machine)
    return cpu_family(cpu.group(1)) if cpu else machine


def _machine_label(machine: str) -> str:
    """A machine as the block names it: a CPU row with its kind (one that names no model trained before runs
    recorded it, on Intel Xeons: :func:`cpu_family`)."""
    cpu = CPU_ROW.fullmatch(machine)
    if cpu and cpu.group(1) is None:
        return f"{machine} (Intel Xeons with AMX: the runs from before runs named their CPU)"
    return f"{machine} ({numerics(machine)})" if numerics(machine) in CPU_ORDER else machine


def _kind_rank(kind: str) -> int:
    return CPU_ORDER.index(kind) if kind in CPU_ORDER else len(CPU_ORDER)


def row_key(row: dict) -> tuple:
    """A row's identity in this sweep's ledgers: preset, arm, seed and the kind of machine it trained on
    (:func:`numerics`): a seed trained again on another kind of CPU is another run, not the same one again."""
    return (row["preset"], row["method"], int(row["seed"]), numerics(row.get("machine")))


def tuning_arm(method: str, value) -> str:
    """The tuning run's arm name: the method and the value it tries (``glofnd-tune-15``)."""
    return f"{method}-tune-{value:g}" if isinstance(value, float) else f"{method}-tune-{value}"


def tuning_plan(testbed: rules.Testbed = rules.DENSE) -> list[tuple[str, str, object]]:
    """(arm, method, value) of every tuning run, method by method."""
    return [(tuning_arm(m, v), m, v) for m in RULE_ARMS.values() for v in dict.fromkeys(rules.candidates(m, testbed))]


def testbed_of(budget: PhaseBudget) -> rules.Testbed:
    """The rules' view of a budget: its epochs, batch and training pairs (five captions per `dense` training image),
    with the tuning world's measured false-negative rate."""
    images, splits = budget.world_size(PRESET)
    return replace(rules.DENSE, epochs=budget.epochs, batch=budget.batch, pairs=round(images * splits["train"]) * 5)


def arm_spec(
    arm: str, method: str | None, value, out: Path, seed: int, testbed: rules.Testbed = rules.DENSE
) -> tuple[str, list[str], str | None]:
    """(recipe, overrides, auxiliary arm) of an arm: ``method`` at its tuned ``value`` for a rule or tuning arm."""
    if arm == BASE:
        return "shapes-uniform", [], None
    if arm == CONTROL:
        return "shapes-uniform", ["pretrain.losses.itc_consistency_weight=0"], None
    if arm == ITC_CEILING:
        return "shapes-uniform", ["pretrain.false_negatives.oracle=mask_itc"], None
    settings = rules.method_settings(method, value, testbed)
    overrides = [
        "pretrain.composer.name=uniform",
        f"pretrain.false_negatives.method={method}",
        *(f"{k}={v}" for k, v in settings.items()),
    ]
    auxiliary = None
    if method == "mafa":  # its Con-D: the same seed's uniform run, trained on the same pairs
        con_d = run_dir(out, PRESET, BASE, seed)
        overrides += [
            "pretrain.false_negatives.mafa.judge=checkpoint",
            f"pretrain.false_negatives.mafa.judge_model={con_d}",
        ]
    elif method == "srcl":  # its frozen auxiliary model: the same seed's uniform run, embedded first
        auxiliary = BASE
    return f"shapes-{method}", overrides, auxiliary


def needs(method: str | None) -> str | None:
    """The arm whose run of the same seed this arm reads (MAFA's Con-D, SRCL's auxiliary model)."""
    return BASE if method in ("mafa", "srcl") else None


def recorded_tuning(ledger: Path = TUNING_LEDGER) -> dict[tuple[str, float], float]:
    """``{(method, value): metric}`` of the tuning runs in ``ledger`` (none when it does not exist)."""
    import pandas as pd

    if not ledger.exists():
        return {}
    frame = pd.read_csv(ledger)
    return {(m, float(v)): float(r) for m, v, r in zip(frame["method"], frame["value"], frame["metric"])}


def tuning_to_run(testbed: rules.Testbed = rules.DENSE, ledger: Path = TUNING_LEDGER) -> list[tuple[str, str, object]]:
    """:func:`tuning_plan`'s runs that ``ledger`` does not record (a recorded one is not run again)."""
    recorded = recorded_tuning(ledger)
    return [(arm, m, v) for arm, m, v in tuning_plan(testbed) if (m, float(v)) not in recorded]


def tuning_results(
    tune_out: Path, testbed: rules.Testbed = rules.DENSE, ledger: Path = TUNING_LEDGER
) -> dict[str, dict]:
    """Per method whose tuning runs have all finished: ``{"key", "value" (chosen), "runs": {value: metric}}``; a run
    whose directory ``tune_out`` lacks counts by its row in ``ledger``."""
    chosen, recorded = {}, recorded_tuning(ledger)
    for method in RULE_ARMS.values():
        results = {}
        tried = tuple(dict.fromkeys(rules.candidates(method, testbed)))
        for value in tried:
            run = run_dir(tune_out, PRESET, tuning_arm(method, value), rules.TUNING_SEED)
            if (run / EVALUATED).exists():
                row = json.loads((run / EVALUATED).read_text())["rows"][0]
                results[value] = (row["oracle_i2t_R@1"] + row["oracle_t2i_R@1"]) / 2
            elif (method, float(value)) in recorded:
                results[value] = recorded[method, float(value)]
        if results and len(results) == len(tried):
            chosen[method] = {"key": rules.RULES[method].tuned.key, "value": rules.select(results), "runs": results}
    return chosen


def tuned_value(method: str, tune_out: Path, testbed: rules.Testbed = rules.DENSE, ledger: Path = TUNING_LEDGER):
    """The method's tuned value: :data:`falcon_cli.method_rules.TUNED`'s, else the tuning runs' choice (in
    ``tune_out``, or recorded in ``ledger``); None while they have not finished."""
    recorded = rules.TUNED.get(method)
    if recorded is not None:
        return next(iter(recorded.values()))
    found = tuning_results(tune_out, testbed, ledger).get(method)
    return None if found is None else found["value"]


def recorded_runs(ledger: Path = LEDGER) -> set[tuple[str, int, str]]:
    """(arm, seed, kind of machine: :func:`numerics`) of the evaluation world's runs that ``ledger`` records (none when
    it does not exist; a ledger without a ``machine`` column: rows from before runs recorded their CPU)."""
    import pandas as pd

    if not ledger.exists():
        return set()
    frame = pd.read_csv(ledger, dtype={"machine": str})
    machines = frame["machine"] if "machine" in frame else [None] * len(frame)
    return {(arm, int(seed), numerics(m)) for arm, seed, m in zip(frame["method"], frame["seed"], machines)}


def eval_plan(
    arms, seeds, recorded: set[tuple[str, int, str]] = frozenset(), here: str = CPU_ORDER[0]
) -> list[tuple[str, int]]:
    """(arm, seed) of the evaluation world's runs to train on this machine (its kind: ``here``, a
    :func:`cpu_family`), in the order they are submitted to the pool.

    A run ``recorded`` in the ledger is not trained again (its row stands for its directory, as a tuning run's does),
    unless a run still to train needs it on this kind of CPU: its base (:data:`BASE_OF`, and the base's base: a
    method is compared with the control, the control with uniform) and what it reads (MAFA's Con-D and SRCL's
    auxiliary model, the same seed's base run) are trained here again where they were recorded on another kind only,
    since a paired difference keeps each seed on one kind of CPU (:func:`cpu_family`); and a recorded base run a
    method reads is trained again where a new machine lacks its checkpoint. So the base's runs to train go first
    (every arm is compared with them), then the arms that read nothing, then, two seeds at a time, the recorded base
    runs that are read and their readers: a base run is never trained long before the runs that need it (a session
    that ends between them loses it), and a reader never waits in the pool behind its own base run."""
    anywhere = {(a, s) for a, s, _ in recorded}
    new = [(a, s) for a in ARMS if a in set(arms) for s in seeds if (a, s) not in anywhere]
    wanted = set(new)
    for arm, seed in new:  # (each new run's bases, down to uniform, where this kind of CPU has not trained them)
        base = BASE_OF.get(arm)
        while base in ARMS:
            if (base, seed, here) not in recorded:
                wanted.add((base, seed))
            base = BASE_OF.get(base)
    todo = [(a, s) for a in ARMS for s in seeds if (a, s) in wanted]
    readers = [a for a in ARMS if needs(RULE_ARMS.get(a))]
    plan = [(a, s) for a, s in todo if a == BASE]
    plan += [(a, s) for a, s in todo if a != BASE and a not in readers]
    for pair in (seeds[i : i + 2] for i in range(0, len(seeds), 2)):
        read = [(r, s) for s in pair for r in readers if (r, s) in wanted]
        plan += [(BASE, s) for s in pair if any(rs == s for _, rs in read) and (BASE, s) not in plan]
        plan += read
    return plan


def run_arm(arm: str, method: str | None, value, seed: int, out: Path, budget: PhaseBudget, threads: int) -> dict:
    recipe, overrides, auxiliary = arm_spec(arm, method, value, out, seed, testbed_of(budget))
    if method == "mafa" and not has_checkpoint(run_dir(out, PRESET, BASE, seed)):
        raise RuntimeError(f"mafa seed {seed}: its Con-D {run_dir(out, PRESET, BASE, seed)} has no checkpoint yet")
    return run_one(PRESET, arm, seed, out, budget, threads, arm=(recipe, overrides), auxiliary=auxiliary)


# --- rows ------------------------------------------------------------------------------------------------

FLAG_KEYS = ("flagged", "precision", "recall", "weight_false", "weight_true", "false_share")


def flag_rows(arm: str, seed: int, run: Path) -> list[dict]:
    """A run's per-epoch ``kind: false_negatives`` records (both directions and pooled), one row per epoch (1-based);
    a record written twice (a resumed run) counts once, the later one."""
    from falcon_cli.runtime.metrics import read_metrics

    records = {r["epoch"]: r for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "false_negatives"}
    keys = [f"{d}{k}" for d in ("", "i2t_", "t2i_") for k in (*FLAG_KEYS, "true_false_negatives", "negatives")]
    return [
        {"arm": arm, "seed": seed, "epoch": epoch + 1, **{k: r.get(k) for k in keys}}
        for epoch, r in sorted(records.items())
    ]


def fair_row(arm: str, seed: int, run: Path) -> dict:
    """A run's row (:func:`benchmarks.phase_sweep.run_row`) with its last epoch's flag scores (``flags_*``) and the
    mean of each over the epochs the method acted in (``flags_mean_*``)."""
    row = run_row(PRESET, arm, seed, run)
    epochs = flag_rows(arm, seed, run)
    for key in (
        "flagged",
        "precision",
        "recall",
        "weight_false",
        "weight_true",
        "i2t_precision",
        "i2t_recall",
        "t2i_precision",
        "t2i_recall",
    ):
        values = [e[key] for e in epochs if e.get(key) is not None]
        row[f"flags_{key}"] = values[-1] if values else None
        row[f"flags_mean_{key}"] = sum(values) / len(values) if values else None
    row["flags_epochs"] = len(epochs)
    return row


def as_recorded(frame, arm_column: str = "method", header: list[str] | None = None):
    """``frame`` as its ledger keeps it: every number at the ledger's four decimals (``float_format="%.4f"``), the
    rows in :data:`ARMS`' order (then the H200 arms), by seed and epoch, and the columns in ``header``'s order (the
    ledger's own, where it exists; a column it lacks goes last). So a collect from the run directories and a collect
    from the ledgers alone (the directories gone with a machine) write the same page and the same files."""
    import pandas as pd

    if not len(frame):
        return frame
    header = [c for c in header or [] if c in frame.columns]
    frame = frame[[*header, *(c for c in frame.columns if c not in header)]].copy()
    for column in frame.columns:
        values = frame[column]
        if not pd.api.types.is_numeric_dtype(values):  # (a column of None and numbers comes out of records as object)
            if not all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                continue
            values = pd.to_numeric(values)
        if pd.api.types.is_float_dtype(values):  # (exactly what "%.4f" writes and read_csv reads back)
            values = values.map(lambda v: v if v != v else float(f"{v:.4f}"))
        frame[column] = values
    order = {arm: i for i, arm in enumerate((*ARMS, "uniform", "uniform-oracle"))}
    frame["_order"] = frame[arm_column].map(lambda a: order.get(a, len(order)))
    keys = ["_order", arm_column, *(k for k in ("seed", "epoch") if k in frame.columns)]
    return frame.sort_values(keys, kind="stable").drop(columns="_order").reset_index(drop=True)


def apart_from_their_rows(retrained) -> set[tuple[str, int, str]]:
    """(arm, seed, kind of machine: :func:`numerics`) of the recorded runs trained again on their own kind of machine
    whose measurements differ from their recorded rows (:func:`~benchmarks.phase_sweep.retrained_runs`'
    ``differing``): their rows stand, and the new runs are only reported (every other arm of that seed was trained
    beside the recorded run: a paired difference keeps a seed on one machine)."""
    if retrained is None or not len(retrained):
        return set()
    differ = retrained[retrained["differing"] > 0]
    return {(m, int(s), numerics(k)) for m, s, k in zip(differ["method"], differ["seed"], differ["machine"])}


def finished(out: Path, arms) -> list[tuple[str, int, Path]]:
    done = []
    for arm in arms:
        for run in sorted((out / "runs" / PRESET).glob(f"{arm}-s*")):
            seed = run.name.removeprefix(f"{arm}-s")
            if seed.isdigit() and (run / EVALUATED).exists() and (run / AUDITED).exists():
                done.append((arm, int(seed), run))
    return done


# --- the report -----------------------------------------------------------------------------------------


def _by_kind(table, method: str, metric: str) -> dict[int, dict[str, float]]:
    """``method``'s ``metric`` keyed by seed, then by the kind of machine the seed trained on (:func:`numerics`)."""
    rows = table[table["method"] == method]
    if metric not in rows:
        return {}
    found: dict = {}
    for seed, machine, value in zip(rows["seed"], rows["machine"], rows[metric]):
        found.setdefault(int(seed), {})[numerics(machine)] = value
    return found


def paired_values(table, arm: str, reference: str, metric: str) -> tuple[dict, dict]:
    """``arm``'s and ``reference``'s ``metric`` keyed by the seeds both have, each seed taken on one kind of machine:
    one both trained it on (the first of :data:`CPU_ORDER` where they share several), else each arm's first (the
    device's own effect: a CPU arm against the ledger's H200 one)."""
    a, b = _by_kind(table, arm, metric), _by_kind(table, reference, metric)
    left, right = {}, {}
    for seed in sorted(set(a) & set(b)):
        shared = sorted(set(a[seed]) & set(b[seed]), key=_kind_rank)
        mine = shared[0] if shared else min(a[seed], key=_kind_rank)
        theirs = shared[0] if shared else min(b[seed], key=_kind_rank)
        left[seed], right[seed] = a[seed][mine], b[seed][theirs]
    return left, right


def _pairs(table, arm: str, reference: str, metric: str):
    """``arm − reference`` in ``metric``, seed by seed on one kind of machine (:func:`paired_values`,
    :func:`~falcon_cli.evaluation.intervals.paired_by_seed`); None where either has no run with it."""
    a, b = paired_values(table, arm, reference, metric)
    return paired_by_seed(a, b) if a and b else None


def own_rows(table):
    """A row per arm and seed: the seed on the first kind of machine the arm trained it on (:data:`CPU_ORDER`). An
    arm's means over seeds are over these; a seed it trained again on another kind of CPU only pairs there with the
    runs that need it (:func:`eval_plan`)."""
    if not len(table):
        return table
    rank = table["machine"].map(lambda m: _kind_rank(numerics(m)))
    return (
        table.assign(_rank=rank)
        .sort_values(["_rank"], kind="stable")
        .drop_duplicates(["method", "seed"])[list(table.columns)]
        .sort_index()
    )


def _other_kinds(table) -> list[str]:
    """A line naming the runs a seed trained on a second kind of CPU, and what they pair with; none without any."""
    own = set(own_rows(table).index)
    extra = table[~table.index.isin(own)]
    if not len(extra):
        return []
    where = []
    for kind, rows in extra.groupby(extra["machine"].map(numerics), sort=False):
        runs = "; ".join(
            f"`{arm}` seed{'s' if len(r) > 1 else ''} {', '.join(str(s) for s in sorted(r['seed']))}"
            for arm, r in rows.groupby("method", sort=False)
        )
        where.append(f"{runs} ({kind}: {'; '.join(sorted(set(rows['machine'])))})")
    there = table["machine"].map(numerics).isin(set(extra["machine"].map(numerics)))
    readers = sorted({f"`{a}`" for a in table[there & table["method"].isin(RULE_ARMS)]["method"]})
    return [
        f"*Seeds on a second kind of CPU:* {' and '.join(where)} trained again there, for "
        f"{', '.join(readers) or 'the arms still to train'} of those seeds: another kind of CPU trains other "
        "numbers from the same commit, seed and config, so each seed of an arm is paired with its base on the kind "
        f"both trained it on ({CPU_ORDER[0]} where both trained it on each). An arm's columns above average its runs "
        "on the first kind of machine it trained each seed on; these runs enter only its pairs.",
        "",
        *_kind_effect(table, extra),
    ]


def _kind_effect(table, extra) -> list[str]:
    """The kind of CPU's own effect: each arm's runs on a second kind (``extra``) − its runs of the same seeds on the
    first (:func:`own_rows`), paired by seed, and how many measurements each seed's two runs differ in (the same arm,
    commit, seed and config: nothing differs but the CPU and the encoders it trained)."""
    own = own_rows(table).set_index(["method", "seed"])
    effects = []
    for (arm, kind), rows in extra.groupby([extra["method"], extra["machine"].map(numerics)], sort=False):
        rows = rows.sort_values("seed")
        first = own.loc[arm].loc[list(rows["seed"])]
        cells = [
            f"{name} {_d(paired_by_seed(dict(zip(rows['seed'], rows[metric])), first[metric].to_dict()))}"
            for metric, name in (
                ("R@1", "ITC R@1"),
                ("oracle_R@1", "FN-aware ITC R@1"),
                ("rerank_oracle_R@1", "FN-aware re-ranked R@1"),
            )
            if metric in rows
        ]
        differ = []
        for row in rows.to_dict("records"):
            compared, changes = measurement_changes(row, first.loc[row["seed"]].to_dict())
            differ.append(f"seed {row['seed']} {len(changes)} of {compared}")
        effects.append(f"`{arm}` on {kind}: {', '.join(cells)} (measurements that differ: {', '.join(differ)})")
    return [
        "*The kind of CPU's own effect* (an arm's run on the second kind − its run on the first, paired by seed): "
        + "; ".join(effects)
        + ".",
        "",
    ]


def _d(d, digits: int = 2) -> str:
    """A paired difference: its mean and 95% interval (emphasised where the interval excludes zero), with the seeds."""
    if d is None:
        return "—"
    if d.n < 2 or math.isnan(d.lo):
        return f"{d.mean:+.{digits}f} ({d.n} seed{'s' if d.n != 1 else ''})"
    text = f"{d.mean:+.{digits}f} [{d.lo:+.{digits}f}, {d.hi:+.{digits}f}]"
    return (f"**{text}**" if d.lo > 0 or d.hi < 0 else text) + f" ({d.positive}/{d.n} +)"


def _m(rows, key: str, digits: int = 1) -> str:
    values = rows[key].dropna() if key in rows else []
    if len(values) == 0:
        return "—"
    return f"{values.mean():.{digits}f}" + (f" ± {values.std(ddof=1):.{digits}f}" if len(values) > 1 else "")


def report_lines(table, tuning: dict, command: str, retrained=None, decisions=None) -> list[str]:
    """The page's block: the device's effect and the control first (the noise and the setup), then each method
    against its base and its ceiling, its flags, and the tuning it was given; last, the recorded runs trained again
    (``retrained``: :func:`~benchmarks.phase_sweep.retrained_runs`' rows) against their recorded rows."""
    own = own_rows(table)
    machines = sorted(set(table["machine"]), key=lambda m: (_kind_rank(numerics(m)), m))
    lines = [
        f"**Command:** `{command}`  ",
        f"**Runs:** {len(table)} "
        f"({', '.join(f'{a} {len(table[table.method == a])}' for a in dict.fromkeys(table['method']))}); "
        f"commits {', '.join(sorted(set(table['commit'])))}; {'; '.join(_machine_label(m) for m in machines)}.",
        "",
    ]
    device = _pairs(table, BASE, "uniform", "oracle_R@1")
    device_r1 = _pairs(table, BASE, "uniform", "R@1")
    usable = device is not None and device.n >= 2 and -DEVICE_TOLERANCE <= device.lo and device.hi <= DEVICE_TOLERANCE
    lines += [
        "*The device's own effect* (uniform on 2 CPU cores, fp32, each seed on the first kind of CPU that trained it, "
        "− the ledger's uniform on an H200, bf16, "
        f"paired by seed): FN-aware ITC R@1 {_d(device)}, ITC R@1 {_d(device_r1)}. "
        + (
            "Within ±0.5: the ledger's H200 oracle arms stand in for CPU ones."
            if usable
            else "Not within ±0.5 (or not yet measured): only CPU arms are compared below, and MAFA's full-oracle "
            "ceiling (the ledger's H200 `uniform-oracle`) is shown for scale, not subtracted."
        ),
        "",
    ]
    control = {m: _pairs(table, CONTROL, BASE, m) for m in ("R@1", "oracle_R@1", "rerank_oracle_R@1")}
    lines += [
        "*The control* (uniform without GRIT's consistency term − uniform with it, CPU): ITC R@1 "
        f"{_d(control['R@1'])}, FN-aware ITC R@1 {_d(control['oracle_R@1'])}, FN-aware re-ranked R@1 "
        f"{_d(control['rerank_oracle_R@1'])}. Every method below drops the term; its difference from the control "
        "is its mechanism alone.",
        "",
    ]
    head = (
        "| arm | its base | seeds | ITC R@1 | FN-aware ITC R@1 | FN-aware re-ranked R@1 | ITM loss, last epoch | "
        "Δ FN-aware ITC vs its base | Δ FN-aware re-ranked vs its base | Δ ITC R@1 vs its base | "
        "share of its ceiling's gain: FN-aware ITC | share: FN-aware re-ranked |"
    )
    lines += [head, "|---" * (head.count("|") - 1) + "|"]
    for arm in [
        a for a in (BASE, CONTROL, *RULE_ARMS, ITC_CEILING, "uniform", "uniform-oracle") if a in set(table["method"])
    ]:
        rows = own[own["method"] == arm]
        method, base = RULE_ARMS.get(arm), BASE_OF.get(arm)
        cells = [
            f"`{arm}`",
            f"`{base}`" if base else "",
            str(len(rows)),
            _m(rows, "R@1"),
            _m(rows, "oracle_R@1"),
            _m(rows, "rerank_oracle_R@1"),
            _m(rows, "itm_final", 3) + _head(rows),
        ]
        if base is None:
            cells += ["", "", "", "", ""]
        else:
            cells += [_d(_pairs(table, arm, base, m)) for m in ("oracle_R@1", "rerank_oracle_R@1", "R@1")]
            if method is None:
                cells += ["", ""]
            else:
                usable_ceiling = CEILING[method] != "uniform-oracle" or usable
                cells += [
                    _share(table, arm, method, m) if usable_ceiling else "—"
                    for m in ("oracle_R@1", "rerank_oracle_R@1")
                ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *_other_kinds(table)]
    lines += [
        f"ITM loss: a head that has learned nothing but the label rate scores {ITM_PRIOR:.3f}; it has left that "
        f"prior where its mean over seeds is {GATE_HEAD_MARGIN} or more below it (the gate's criterion). Its base: "
        "what the arm differs from in one thing (each method drops GRIT's consistency term, so its base is the "
        "control). Share of its ceiling's gain: the method's mean gain over its base, over the mean gain of its "
        f"ceiling (`{ITC_CEILING}` for the ITC-only methods, the full oracle for MAFA) over uniform, with Fieller's "
        "95% interval (the two gains paired by seed); shown only where the ceiling's gain is above zero by its "
        "interval.",
        "",
    ]
    lines += _top1_lines(table)
    flagging = [a for a in RULE_ARMS if a in set(table["method"])]
    if not flagging:
        lines += ["*What each method flagged or weighted, against the oracle*: no method's run has finished yet.", ""]
    else:
        lines += _flag_lines(table, flagging)
    if decisions is not None and len(decisions):
        lines += _decision_lines(decisions)
    if tuning:
        lines += [
            "*The tuning* (the tuning world, world seed "
            f"{rules.TUNING_WORLD_SEED}, training seed {rules.TUNING_SEED}; FN-aware ITC R@1 on its test split):",
            "",
        ]
        for method, found in tuning.items():
            tried = ", ".join(f"{found['key'].rsplit('.', 1)[-1]} = {v}: {r:.2f}" for v, r in found["runs"].items())
            lines.append(f"- {method}: {tried}; kept {found['value']}.")
        lines.append("")
    if retrained is not None and len(retrained):
        lines += [
            "*Runs trained again* (recorded in the ledger, trained again because a method reads their checkpoint; "
            "every measurement against the recorded row at its four decimals, times aside):",
            "",
        ]
        for r in retrained.sort_values(["method", "seed"]).to_dict("records"):
            where = f"{r['commit']}, {r['machine']}; recorded from {r['ledger_commit']}, {r['ledger_machine']}"
            if r["differing"] == 0:
                found = f"all {r['measurements']} measurements equal the recorded ones"
            else:
                found = (
                    f"{r['differing']} of {r['measurements']} measurements differ, by at most {r['largest']:.4f} "
                    f"({r['changes']}); the recorded row stands"
                )
            lines.append(f"- `{r['method']}` seed {r['seed']} ({where}): {found}.")
        lines.append("")
    return lines


def _top1_lines(table) -> list[str]:
    """Where each arm's top-1 went: the labelled pair (plain R@1), another true match (FN-aware − plain R@1: the two
    differ only in counting a true but unlabelled match as a hit) or a wrong one (100 − FN-aware R@1). A method that
    stops pushing false negatives away can lose plain R@1 to the middle column without ranking worse. (The change in
    wrong top-1s is minus the FN-aware ITC change the main table gives, so it is not repeated here.)"""
    table = table.assign(
        **{"other_true_R@1": table["oracle_R@1"] - table["R@1"], "wrong_R@1": 100 - table["oracle_R@1"]}
    )
    head = (
        "| arm | top-1 the labelled pair | top-1 another true match | top-1 wrong | Δ another true match vs its base |"
    )
    lines = [
        "*Where each arm's top-1 went* (% of queries, both directions averaged; mean ± std over seeds):",
        "",
        head,
        "|---" * (head.count("|") - 1) + "|",
    ]
    own = own_rows(table)
    for arm in [a for a in (BASE, CONTROL, *RULE_ARMS, ITC_CEILING) if a in set(table["method"])]:
        rows, base = own[own["method"] == arm], BASE_OF.get(arm)
        cells = [f"`{arm}`", _m(rows, "R@1"), _m(rows, "other_true_R@1"), _m(rows, "wrong_R@1")]
        cells.append(_d(_pairs(table, arm, base, "other_true_R@1")) if base else "")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _head(rows) -> str:
    """Whether the arm's ITM head left its prior: its last epoch's loss, averaged over seeds, at least
    :data:`~benchmarks.phase_sweep.GATE_HEAD_MARGIN` below :data:`~benchmarks.phase_sweep.ITM_PRIOR`."""
    values = rows["itm_final"].dropna() if "itm_final" in rows else []
    if len(values) == 0:
        return ""
    return " (left the prior)" if values.mean() <= ITM_PRIOR - GATE_HEAD_MARGIN else " (at the prior)"


def _share(table, arm: str, method: str, metric: str) -> str:
    """The arm's mean gain over its base as a share of its ceiling's mean gain over uniform, in ``metric``, with
    Fieller's 95% interval over the seeds both have (:func:`~falcon_cli.evaluation.intervals.paired_ratio`: the two
    gains are paired by seed). A ceiling whose gain is not above zero by its interval, or has no interval yet (one
    seed), has no share to give (the ratio would be noise over noise, its interval unbounded)."""
    gain = _pairs(table, arm, BASE_OF[arm], metric)
    ceiling = _pairs(table, CEILING[method], BASE_OF[CEILING[method]], metric)
    if gain is None or ceiling is None:
        return "—"
    if ceiling.n < 2 or math.isnan(ceiling.lo):
        return f"— (its ceiling has {ceiling.n} seed{'s' if ceiling.n != 1 else ''}: no interval yet)"
    if ceiling.lo <= 0:
        return f"— (its ceiling's gain {ceiling.mean:+.2f} [{ceiling.lo:+.2f}, {ceiling.hi:+.2f}] is not above 0)"
    gains = _by_seed(table, arm, BASE_OF[arm], metric)
    ceilings = _by_seed(table, CEILING[method], BASE_OF[CEILING[method]], metric)
    seeds = sorted(set(gains) & set(ceilings))
    if len(seeds) < 2:
        return f"{100 * gain.mean / ceiling.mean:.0f}% of {ceiling.mean:+.2f} ({len(seeds)} seed(s) in common)"
    share = paired_ratio([gains[s] for s in seeds], [ceilings[s] for s in seeds])
    if math.isinf(share.lo) or math.isinf(share.hi):  # (the ceiling's gain over these seeds alone is not away from 0)
        return f"{100 * share.ratio:.0f}% (no bound yet over the {len(seeds)} seeds in common) of {ceiling.mean:+.2f}"
    return f"{100 * share.ratio:.0f}% [{100 * share.lo:.0f}%, {100 * share.hi:.0f}%] of {ceiling.mean:+.2f}"


def _by_seed(table, arm: str, reference: str, metric: str) -> dict:
    """``arm − reference`` in ``metric`` keyed by the seeds both have (missing values leave their seed out)."""
    a, b = paired_values(table, arm, reference, metric)
    return {s: float(a[s]) - float(b[s]) for s in set(a) & set(b) if a[s] == a[s] and b[s] == b[s]}


def _flag_lines(table, arms: list[str]) -> list[str]:
    """The flags table (the last epoch of each run, mean ± std over seeds) and the figure's link."""
    lines = [
        "*What each method flagged or weighted, against the oracle* (the last epoch; both directions pooled, then "
        "image and text anchors; mean ± std over seeds):",
        "",
        "| arm | flagged per epoch | precision | recall | i2t precision / recall | t2i precision / recall | "
        "mean weight, false / true negatives |",
        "|---|---|---|---|---|---|---|",
    ]
    own = own_rows(table)
    for arm in arms:
        rows = own[own["method"] == arm]
        lines.append(
            f"| `{arm}` | {_m(rows, 'flags_flagged', 0)} | {_m(rows, 'flags_precision', 3)} | "
            f"{_m(rows, 'flags_recall', 3)} | "
            f"{_m(rows, 'flags_i2t_precision', 3)} / {_m(rows, 'flags_i2t_recall', 3)} | "
            f"{_m(rows, 'flags_t2i_precision', 3)} / {_m(rows, 'flags_t2i_recall', 3)} | "
            f"{_m(rows, 'flags_weight_false', 3)} / {_m(rows, 'flags_weight_true', 3)} |"
        )
    return lines + ["", "![flags over training](results/fair_dense_flags.png)", ""]


MAFA_DECISIONS = "mafa-decisions"
"""Under ``--out``: ``s<seed>/decisions.json``, ``benchmarks/mafa_decisions.py``'s replay of ``mafa-rule``'s runs."""


def decision_rows(out: Path) -> list[dict]:
    """A row per replayed ``mafa-rule`` seed (``OUT/mafa-decisions/s<seed>/decisions.json``): its conversions and
    swaps against the oracle, and how many logged steps the replay was checked on."""
    rows = []
    for path in sorted((out / MAFA_DECISIONS).glob("s*/decisions.json")):
        d = json.loads(path.read_text())
        both = d["both"]
        rows.append(
            {
                "arm": "mafa-rule",
                "seed": int(path.parent.name[1:]),
                "candidates": both["candidates"],
                "false_negative_rate": both["false_negative_rate"],
                "converted": both["converted"]["count"],
                "converted_precision": both["converted"]["precision"],
                "swapped": both["swapped"]["count"],
                "swapped_share": both["swapped"]["share"],
                "swapped_precision": both["swapped"]["precision"],
                "swapped_recall": both["swapped"]["recall"],
                "i2t_swapped_precision": d["i2t"]["swapped"]["precision"],
                "t2i_swapped_precision": d["t2i"]["swapped"]["precision"],
                "auc": both["auc"],
                "max_p": both["max_p"],
                "logged_steps_checked": d["logged_steps_checked"],
                "steps_replayed": d["steps_replayed"],
            }
        )
    return rows


def _decision_lines(decisions) -> list[str]:
    """MAFA's replayed decisions (:func:`decision_rows`), mean ± std over the seeds replayed."""
    seeds = ", ".join(str(s) for s in sorted(decisions["seed"]))
    return [
        "*MAFA's decisions, replayed* (`benchmarks/mafa_decisions.py` on each seed's run: its Con-D on the run's own "
        "hardest candidates, the replay checked against the run's logged conversions and swaps on every logged step "
        "it covers, and stopped had one differed; mean ± std over the seeds replayed):",
        "",
        "| seeds | steps replayed / logged steps matched | candidates that are false negatives | converted | Con-D's "
        "max p(match) | swapped (share of anchors) | swaps' precision | i2t / t2i | recall | Con-D's AUC, false "
        "against true negatives |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {seeds} | {_m(decisions, 'steps_replayed', 0)} / {_m(decisions, 'logged_steps_checked', 0)} | "
        f"{_m(decisions, 'false_negative_rate', 3)} | {_m(decisions, 'converted', 0)} | "
        f"{_m(decisions, 'max_p', 2)} | {_m(decisions, 'swapped_share', 4)} | "
        f"{_m(decisions, 'swapped_precision', 3)} | "
        f"{_m(decisions, 'i2t_swapped_precision', 3)} / {_m(decisions, 't2i_swapped_precision', 3)} | "
        f"{_m(decisions, 'swapped_recall', 3)} | {_m(decisions, 'auc', 3)} |",
        "",
    ]


def flag_figure(flags, path: Path) -> Path | None:
    """Per rule arm, precision and recall of its flags (or the mean weights it gave false and true negatives) over the
    epochs, every seed a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in RULE_ARMS if a in set(flags["arm"])] if len(flags) else []
    if not arms:
        return None
    fig, axes = plt.subplots(1, len(arms), figsize=(4 * len(arms), 3.2), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        rows = flags[flags["arm"] == arm]
        weights = rows["weight_false"].notna().any()
        series = (
            (
                ("weight_false", "false negatives' weight", "tab:red"),
                ("weight_true", "true negatives' weight", "tab:blue"),
            )
            if weights
            else (("precision", "precision", "tab:red"), ("recall", "recall", "tab:blue"))
        )
        for key, label, colour in series:
            for i, (seed, seed_rows) in enumerate(rows.groupby("seed")):
                ax.plot(
                    seed_rows["epoch"],
                    seed_rows[key],
                    color=colour,
                    alpha=0.6,
                    marker="o",
                    markersize=2,
                    label=label if i == 0 else None,
                )
        if not weights:
            ax.set_ylim(-0.02, 1.02)
        ax.set_title(arm)
        ax.set_xlabel("epoch")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    import argparse

    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="The evaluation world's sweep directory.")
    parser.add_argument("--tune-out", type=Path, help="The tuning world's sweep directory (default: OUT-tune).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--only", nargs="+", choices=[*ARMS, "tune"], help="A subset of the arms (tune: the tuning runs)."
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="Torch threads per run.")
    parser.add_argument(
        "--budget", choices=["cpu", "quick"], default="cpu", help="quick: a smoke test (nothing learns)."
    )
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE", help="Change fields of the budget.")
    parser.add_argument(
        "--rows",
        type=Path,
        nargs="*",
        default=[Path("docs/results/phase_results.csv"), LEDGER],
        metavar="CSV",
        help="Ledgers of rows whose run directories OUT lacks: the H200 uniform and oracle "
        "arms of the same world, and this sweep's own rows as last reported (its "
        "per-epoch flags beside them, in fair_dense_flags.csv).",
    )
    parser.add_argument(
        "--ledger",
        type=Path,
        default=LEDGER,
        metavar="CSV",
        help="This sweep's rows as last reported (default: this checkout's docs/results/fair_dense_results.csv; a "
        "campaign run from a pinned clone reads main's): a run it records is not trained again, and its rows stand "
        "for runs whose directories are gone, while it is among --rows.",
    )
    parser.add_argument("--collect", action="store_true", help="Run nothing: the tables, figure and --report only.")
    parser.add_argument("--report", type=Path, help="Rewrite this page's fair block (docs/results.md).")
    args = parser.parse_args()

    from benchmarks.phase_sweep import changed_budget

    ledger = args.ledger
    args.rows = [ledger if p == LEDGER else p for p in args.rows]  # (--ledger stands in for the default's)

    out = args.out.resolve()
    tune_out = (args.tune_out or out.parent / f"{out.name}-tune").resolve()
    # The learning curve every third epoch (benchmarks/README.md, "A dense run's CPU time": the same numbers, 10% less)
    budget = changed_budget(BUDGETS[args.budget], [f"eval_every={EVAL_EVERY}", *args.set])
    testbed = testbed_of(budget)
    tune_budget = replace(budget, world_seed=rules.TUNING_WORLD_SEED)
    wanted = set(args.only or [*ARMS, "tune"])
    start, failures = time.perf_counter(), []
    if not args.collect:
        to_tune = tuning_to_run(testbed) if "tune" in wanted else []
        from falcon_cli.artifacts.provenance import cpu_model

        here = cpu_family(cpu_model())  # (a seed's runs on another kind of CPU pair with their own bases only)
        plan = eval_plan(wanted, args.seeds, recorded_runs(ledger) if ledger in args.rows else set(), here)
        if not plan:
            print(
                f"every run of {', '.join(a for a in ARMS if a in wanted)} is recorded in {ledger} "
                f"(for this kind of CPU: {here})",
                flush=True,
            )
        # (a world is made only while a run is left to train in it)
        worlds = [*([(out, budget)] if plan else []), *([(tune_out, tune_budget)] if to_tune else [])]
        for directory, b in worlds:
            (directory / "logs").mkdir(parents=True, exist_ok=True)
            generate_world(PRESET, directory, b, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            ready = {d: pool.submit(prepare, PRESET, 0, d, b, args.threads * args.jobs) for d, b in worlds}
            futures: dict = {}

            def task(
                directory: Path, b: PhaseBudget, arm: str, method: str | None, value, seed: int, after: list
            ) -> dict:
                ready[directory].result()
                for future in after:  # (submitted before this one: running or done, never queued behind it)
                    future.result()
                if method is not None and value is None:  # a rule arm: its method's tuned value
                    value = tuned_value(method, tune_out, testbed)
                    if value is None:
                        raise RuntimeError(f"{arm}: {method}'s tuning runs in {tune_out} have not finished")
                return run_arm(arm, method, value, seed, directory, b, args.threads)

            def submit(directory, b, arm, method, value, seed, after=()):
                key = ("tune" if directory == tune_out else "eval", arm, seed)
                futures[key] = pool.submit(task, directory, b, arm, method, value, seed, list(after))

            # What a run reads is trained before it: the base's seed 0 and the tuning world's, the tuning runs, then
            # the evaluation world's runs in eval_plan's order (a run the ledger records is not trained again).
            if any(needs(m) for _, m, _ in to_tune):
                submit(tune_out, tune_budget, BASE, None, None, rules.TUNING_SEED)
            if plan and plan[0][0] == BASE:
                submit(out, budget, BASE, None, None, plan[0][1])
            for arm, method, value in to_tune:
                after = [futures[("tune", BASE, rules.TUNING_SEED)]] if needs(method) else []
                submit(tune_out, tune_budget, arm, method, value, rules.TUNING_SEED, after)
            for arm, seed in plan:
                if ("eval", arm, seed) in futures:
                    continue
                method = RULE_ARMS.get(arm)
                after = [f for f in (futures.get(("eval", BASE, seed)),) if f is not None and needs(method)]
                after += [
                    futures[("tune", a, rules.TUNING_SEED)]
                    for a, m, _ in tuning_plan(testbed)
                    if m == method and ("tune", a, rules.TUNING_SEED) in futures
                ]
                submit(out, budget, arm, method, None, seed, after)
            for (world, arm, seed), row in finished_futures(futures, failures):
                print(
                    f"[{time.perf_counter() - start:6.0f} s] {world} {arm} seed {seed}: R@1 {row['R@1']:.1f}, "
                    f"FN-aware {row['oracle_R@1']:.1f}",
                    flush=True,
                )
    tuning = tuning_results(tune_out, testbed)
    if tuning:
        tune_out.mkdir(parents=True, exist_ok=True)
        (tune_out / "tuning.json").write_text(json.dumps(tuning, indent=1, default=str) + "\n")
    done = finished(out, ARMS)
    ledgers = [p for p in args.rows if p.exists()]
    if not done and ledger not in ledgers:
        print("no finished runs yet")
    else:
        mine = [fair_row(arm, seed, run) for arm, seed, run in done]
        # a recorded run trained again (a method reads its checkpoint) against its recorded row, kept once found:
        # the ledger is rewritten with the new row below, so the comparison cannot be made again later
        retrained = pd.DataFrame(retrained_runs(mine, ledgers, key=row_key))
        # one that differs does not replace its recorded row (:func:`apart_from_their_rows`)
        apart = apart_from_their_rows(retrained)
        kept = [(row, run) for row, run in zip(mine, done) if row_key(row)[1:] not in apart]
        mine, done = [row for row, _ in kept], [run for _, run in kept]
        rows = merge_ledgers(mine, ledgers, key=row_key)
        retrained_ledger = ledger.with_name("fair_dense_retrained.csv")
        if ledger in ledgers and retrained_ledger.exists():
            earlier = pd.read_csv(retrained_ledger, dtype={"commit": str, "ledger_commit": str})
            retrained = pd.concat([earlier, retrained], ignore_index=True) if len(retrained) else earlier
            retrained = retrained.drop_duplicates(["method", "seed", "commit", "pretrain_seconds"], keep="first")
        table = as_recorded(
            pd.DataFrame(
                [r for r in rows if r["preset"] == PRESET and r["method"] in (*ARMS, "uniform", "uniform-oracle")]
            ),
            header=list(pd.read_csv(ledger, nrows=0).columns) if ledger in ledgers else None,
        )
        flags = pd.DataFrame([f for arm, seed, run in done for f in flag_rows(arm, seed, run)])
        flag_ledger = ledger.with_name("fair_dense_flags.csv")
        if ledger in ledgers and flag_ledger.exists():  # the per-epoch flags of runs whose directories are gone
            earlier = pd.read_csv(flag_ledger)
            have = {(a, s) for a, s, _ in done}
            earlier = earlier[[(a, s) not in have for a, s in zip(earlier["arm"], earlier["seed"])]]
            flags = pd.concat([flags, earlier], ignore_index=True) if len(flags) else earlier
        decisions = pd.DataFrame(decision_rows(out))
        decision_ledger = ledger.with_name("fair_dense_mafa_decisions.csv")
        if ledger in ledgers and decision_ledger.exists():  # the replays of runs whose directories are gone
            earlier = pd.read_csv(decision_ledger)
            if len(decisions):
                earlier = earlier[~earlier["seed"].isin(decisions["seed"])]
            decisions = pd.concat([decisions, earlier], ignore_index=True) if len(decisions) else earlier
        flags, decisions = as_recorded(flags, "arm"), as_recorded(decisions, "arm")
        out.mkdir(parents=True, exist_ok=True)  # (--collect of the ledgers alone, on a machine without the runs)
        table.to_csv(out / "results.csv", index=False, float_format="%.4f")
        if len(flags):
            flags.to_csv(out / "flags.csv", index=False, float_format="%.4f")
        figure = flag_figure(flags, out / "flags.png")
        command = "PYTHONPATH=. .venv/bin/python benchmarks/fair_dense.py " + " ".join(sys.argv[1:])
        lines = report_lines(table, tuning, command, retrained, decisions)
        print("\n".join(lines))
        if args.report:
            report = args.report.resolve()
            results = report.parent / "results"  # (beside the page, as docs/results/ is beside docs/results.md)
            results.mkdir(exist_ok=True)
            table[table["method"].isin(ARMS)].to_csv(
                results / "fair_dense_results.csv", index=False, float_format="%.4f"
            )
            if len(flags):
                flags.to_csv(results / "fair_dense_flags.csv", index=False, float_format="%.4f")
            if len(retrained):
                retrained.to_csv(results / "fair_dense_retrained.csv", index=False, float_format="%.4f")
            if len(decisions):
                decisions.to_csv(results / "fair_dense_mafa_decisions.csv", index=False, float_format="%.4f")
            if figure is not None:
                import shutil

                shutil.copyfile(figure, results / "fair_dense_flags.png")
            if tuning:
                pd.DataFrame(
                    [
                        {
                            "method": m,
                            "key": f["key"],
                            "value": v,
                            "metric": r,
                            "chosen": v == f["value"],
                            "world_seed": rules.TUNING_WORLD_SEED,
                            "seed": rules.TUNING_SEED,
                        }
                        for m, f in tuning.items()
                        for v, r in f["runs"].items()
                    ]
                ).to_csv(results / "dense_tuning.csv", index=False, float_format="%.4f")
            replace_block(
                report,
                "<!-- fair:begin -->",
                "<!-- fair:end -->",
                ["<!-- Generated by benchmarks/fair_dense.py --report; edit outside the markers. -->", "", *lines],
            )
    if failures:
        raise SystemExit(f"{len(failures)} run(s) failed:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
