"""Finished runs side by side, judged over seeds: each method's mean with its t interval, and its difference from a
baseline method seed by seed, with the paired-t interval (``falcon compare``).

A run is read from its directory alone: ``manifest.json`` (seed, resolved config, what the stages recorded) and the
``results/*.json`` that ``falcon evaluate`` wrote. Runs are grouped into methods by their resolved configs (the
recipe's name, plus the settings that tell runs of one recipe apart), or by ``--label``, and paired by seed. Runs
that cannot be compared (other pretraining pairs, another evaluation split or evaluation settings, another budget)
are refused with one line naming the run and what differs.

A file or directory another run wrote (MAFA's Con-D, SRCL's auxiliary embeddings, a checkpoint to start from) is an
*input*: each seed has its own, so its path does not make a method. What made it does: the seeds of one method must
take their inputs from runs of one method, trained on the same pairs as they were (:class:`RunInput`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from falcon_cli.artifacts.atomic import atomic_dir, atomic_path, write_text
from falcon_cli.artifacts.renamed_keys import upgrade_stored
from falcon_cli.config.paths import input_path_keys
from falcon_cli.config.recipes import as_current_config
from falcon_cli.config.schema import Recipe
from falcon_cli.errors import FalconError
from falcon_cli.evaluation.intervals import Z95, interval_verdict, mean_interval, paired_by_seed, wilson_interval
from falcon_cli.runtime.metrics import read_metrics

RESULT_FILES = {
    "retrieval": Path("results/retrieval.json"),
    "vqa": Path("results/vqa.json"),
    "nlvr2": Path("results/nlvr2.json"),
    "audit": Path("audit/summary.json"),
}
"""Where a run's numbers come from: what ``falcon evaluate`` and ``falcon audit-false-negatives`` write."""

FLAGS_FILE = Path("metrics.jsonl")
"""Where ``flags:`` metrics come from: the last epoch's ``kind: false_negatives`` record the pretrain stage writes on
a shapes world, a false-negative method's decisions against the oracle (``flags:precision``, ``flags:recall``,
``flags:i2t_precision``, ...; ``flags:weight_false`` / ``flags:weight_true`` for the methods that weight)."""

FLAG_PRODUCERS = (
    "MAFA and GloFND flag (flags:precision, flags:recall, flags:flagged), "
    "SRCL and DiHT weight (flags:weight_false, flags:weight_true)"
)

IDENTITY_IGNORED = (
    "seed",
    "description",
    "stages",
    "data",
    "unimodal",
    "evaluate",
    "audit",
    "finetune",
    "pretrain.runtime.device",
    "pretrain.runtime.precision",
    "pretrain.loader.num_workers",
    "pretrain.logging.every",
    "pretrain.logging.loggers",
    "pretrain.checkpoints.every",
    "pretrain.checkpoints.keep_last",
    "pretrain.runtime.profile_steps",
    "pretrain.eval.split",
    "pretrain.eval.every",
    "pretrain.runtime.compile",
    "pretrain.runtime.compile_mode",
    "pretrain.loader.preload_images",
)
"""Config keys that do not make a method: the seed, where the data lives and how it is read (the pretraining pairs
are checked by their fingerprint instead), the unimodal start and the later stages (the evaluation settings are
checked on the results), and how a run is executed and logged."""

BUDGET_KEYS = (
    "pretrain.model",
    "pretrain.encoders.image_size",
    "pretrain.epochs",
    "pretrain.batch_size",
    "pretrain.max_steps_per_epoch",
    "pretrain.encoders.max_text_length",
    "pretrain.encoders.vision_weights",
    "pretrain.encoders.text_weights",
    "world_size",
)
"""What every compared run must share: the model, its inputs and the training it got (``world_size`` times
``batch_size`` is the global batch)."""

PRODUCER_IGNORED = ("seed", "description", "stages", "data", "unimodal", "world_size")
"""Config keys that do not change what a run wrote for another (:func:`input_source`): its seed and data (the pairs
are checked by their identity instead); nor do the keys that only say how it ran (:data:`EXECUTION_FIELDS`)."""

EXECUTION_FIELDS = frozenset(
    {
        "device",
        "precision",
        "num_workers",
        "log_every",
        "loggers",
        "checkpoint_every",
        "keep_last",
        "profile_steps",
        "compile",
        "compile_mode",
        "preload_images",
        "eval_every",
        "eval_split",
        "chunk_size",
    }
)
"""The last part of any key (``pretrain.runtime.device``, ``embed.num_workers``) that says how a stage ran, not what it
computed."""

EVALUATION_KEYS = {
    "retrieval": (
        "dataset",
        "split",
        "split_fingerprint",
        "k",
        "images",
        "texts",
        "false_negatives",
        "max_text_length",
        "resolution",
        "scoring",
    ),
    "vqa": ("dataset", "split", "questions", "k", "max_text_length", "resolution", "answer_processing"),
    "nlvr2": ("dataset", "max_text_length", "resolution", "statements"),
    "audit": ("judge", "threshold"),
}
"""Per source, the evaluation settings every run's numbers must share (taken from the results' meta and rows)."""


@dataclass(frozen=True)
class RunInput:
    """One input of a run that names a file or directory (:func:`run_inputs`), and what made it."""

    key: str
    """The config key (``pretrain.false_negatives.srcl.aux_embeddings``)."""
    path: Path
    source: str
    """What made it, in words: ``coco-albef-grit run (finetune.checkpoint from coco-albef-grit run)``; ``a file
    outside any run``; ``a missing file``."""
    identity: tuple
    """What made it, compared: the producing run's settings (:data:`PRODUCER_IGNORED` aside), its own inputs by
    their sources in turn."""
    producers: tuple[tuple[Path, tuple[tuple[str, str], ...]], ...]
    """Every run in the chain that made it, with its pretraining pairs' identities (:func:`_dataset_identities`)."""


@dataclass
class Run:
    """One finished run as :func:`read_run` finds it."""

    path: Path
    seed: int
    recipe: str
    config: dict
    dataset: dict[str, str]
    """The pretraining pairs' identities (:func:`_dataset_identities`): their fingerprint, the shard index's, the
    shapes world's, the data path; runs are compared on the most precise kind both have."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Every number the run's results give, by metric name (:func:`metric_names`)."""
    settings: dict[str, dict] = field(default_factory=dict)
    """Per metric name, the evaluation settings it was measured under."""
    counts: dict[str, int] = field(default_factory=dict)
    """Per metric name, the queries (or questions, statements) behind a percentage: its binomial interval's n."""
    label: str = ""
    trained_on: str = ""
    """Where pretraining ran: device and precision (``cuda:0 bf16``, ``cpu fp32``), as the pretrain stage recorded."""
    inputs: list[RunInput] = field(default_factory=list)
    """Its inputs that other runs wrote (:func:`run_inputs`): per seed, so not part of its method."""


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _read_json(path: Path, run: Path) -> dict:
    """A run's manifest, its ``config`` under today's keys and with today's fields (a run written by an earlier
    release too: :func:`~falcon_cli.config.recipes.as_current_config`, as a resumed run is read)."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FalconError(
            f"{path}: line {exc.lineno}: invalid JSON ({exc.msg}); write it again (falcon evaluate ... {run})"
        ) from None
    if isinstance(manifest, dict) and isinstance(manifest.get("config"), dict):
        # (today's keys; a field added since the run was made gets its default, which is what the run did)
        manifest["config"] = as_current_config(upgrade_stored(manifest["config"], str(path)))
    return manifest


def read_run(path: str | Path) -> Run:
    """A run directory's seed, config, pretraining-data identity and every number its results hold."""
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise FalconError(
            f"{path}: not a run directory (no manifest.json); give the directories `falcon run` or "
            "`falcon pretrain` wrote"
        )
    manifest = _read_json(manifest_path, path)
    config = manifest.get("config") or {}
    result = ((manifest.get("stages") or {}).get("pretrain") or {}).get("result") or {}
    run = Run(
        path=path,
        seed=int(manifest.get("seed", config.get("seed", 0))),
        recipe=str(config.get("name", path.name)),
        config={**config, "world_size": manifest.get("world_size", 1)},
        dataset=_dataset_identities(manifest),
        trained_on=" ".join(str(result[k]) for k in ("device", "precision") if result.get(k)),
    )
    run.inputs = run_inputs(config, Path(os.path.abspath(path)))
    for source, relative in RESULT_FILES.items():
        if (path / relative).is_file():
            _add_numbers(run, source, _read_json(path / relative, path))
    if (path / FLAGS_FILE).is_file():
        _add_flags(run, path / FLAGS_FILE)
    if not run.metrics:
        raise FalconError(
            f"{path}: no results yet (no {', '.join(str(p) for p in RESULT_FILES.values())}); "
            f"evaluate it first: falcon evaluate retrieval {path}"
        )
    return run


def _input_keys() -> tuple:
    return input_path_keys(Recipe)


def _under(key: str, prefixes: Sequence[str]) -> bool:
    """Whether ``key`` is one of ``prefixes`` or lies inside one of them (``pretrain.runtime.device`` inside
    ``pretrain``)."""
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def _method_key(key: str) -> bool:
    """Whether a config key can make a method (:data:`IDENTITY_IGNORED` and :data:`BUDGET_KEYS` cannot)."""
    return not _under(key, IDENTITY_IGNORED + BUDGET_KEYS)


def _artifacts(config: dict) -> dict[str, Path]:
    """``{key: path}`` of the input-path values of a resolved config that name a file or directory (not a hub id, a
    keyword or a name)."""
    flat = _flat(config)
    return {key: path for key, marker in _input_keys() for path in [marker.artifact(flat.get(key))] if path is not None}


def _run_holding(path: Path) -> Path | None:
    """The run directory that holds ``path`` (``path`` itself, or the nearest folder above it with a
    ``manifest.json``); None outside any run."""
    for folder in [path, *path.parents]:
        if (folder / "manifest.json").is_file():
            return folder
    return None


def input_source(path: Path, within: Sequence[Path] = (), depth: int = 0) -> tuple[str, tuple, tuple]:
    """``(words, identity, producers)`` of what made ``path`` (:class:`RunInput`): the run that holds it, its
    settings, and in turn what made its own inputs (a run inside ``within`` is the consumer itself, not a maker)."""
    if not path.exists():
        return "a missing file", ("missing",), ()
    producer = _run_holding(path)
    if producer is None or producer in within or depth > 4:
        return "a file outside any run", ("outside",), ()
    manifest = _read_json(producer / "manifest.json", producer)
    config = {**(manifest.get("config") or {}), "world_size": manifest.get("world_size", 1)}
    flat = _flat(config)
    own = {k: p for k, p in _artifacts(config).items() if not _under(k, PRODUCER_IGNORED)}
    settings = {
        k: v
        for k, v in flat.items()
        if k not in own and k.rpartition(".")[2] not in EXECUTION_FIELDS and not _under(k, PRODUCER_IGNORED)
    }
    words, nested, producers = [], [], [(producer, tuple(_dataset_identities(manifest).items()))]
    for key, inner in sorted(own.items()):
        if _run_holding(inner) == producer:  # (its own files: part of what it is)
            continue
        inner_words, inner_identity, inner_producers = input_source(inner, (*within, producer), depth + 1)
        words.append(f"{key} from {inner_words}")
        nested.append((key, inner_identity))
        producers += inner_producers
    name = str(config.get("name", producer.name))
    return (
        f"{name} run" + (f" ({'; '.join(words)})" if words else ""),
        (name, tuple(sorted((k, _value(v)) for k, v in settings.items())), tuple(nested)),
        tuple(producers),
    )


def run_inputs(config: dict, path: Path) -> list[RunInput]:
    """The inputs of a run that other runs wrote: the input-path settings that could make a method
    (``pretrain.false_negatives.mafa.judge_model``, ``pretrain.false_negatives.srcl.aux_embeddings``, ``embed.encoder``,
    ``pretrain.encoders.init``, ...) and name a file or directory outside the run itself."""
    found = []
    for key, artifact in _artifacts(config).items():
        if not _method_key(key) or _run_holding(artifact) == path:
            continue
        words, identity, producers = input_source(artifact, (path,))
        found.append(RunInput(key, artifact, words, identity, producers))
    return found


def _dataset_identities(manifest: dict) -> dict[str, str]:
    """Every identity of the pretraining pairs a run's manifest gives, most precise first: the fingerprint its pretrain
    stage recorded (``pairs``), the shard index's (``shards``), the shapes world's generation config (``shapes
    world``, wherever the world lies), and the data path (``path``). Runs from before a kind was recorded lack it."""
    stages = manifest.get("stages") or {}
    found = {}
    result = (stages.get("pretrain") or {}).get("result") or {}
    if result.get("dataset_fingerprint"):
        found["pairs"] = result["dataset_fingerprint"][:12]
    data = (stages.get("data") or {}).get("result") or {}
    if (data.get("shard_index") or {}).get("fingerprint"):
        found["shards"] = data["shard_index"]["fingerprint"][:12]
    dataset = str(((manifest.get("config") or {}).get("data") or {}).get("dataset") or "")
    world = shapes_world_fingerprint(dataset)
    if world is not None:
        found["shapes world"] = world
    found["path"] = dataset
    return found


def shapes_world_fingerprint(dataset: str | Path) -> str | None:
    """12 hex digits of the shapes world in ``dataset``: its ``world.json`` generation config (every knob its preset
    resolved to); None where the directory holds no world. Knobs at None are left out, so a knob added later whose
    None leaves worlds as they were does not tell a regenerated world from the same world generated before it."""
    path = Path(dataset) / "world.json"
    if not path.is_file():
        return None
    config = {k: v for k, v in json.loads(path.read_text()).get("config", {}).items() if v is not None}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def same_pairs(a: dict[str, str], b: dict[str, str]) -> tuple[bool, str]:
    """Whether two runs' identities (:func:`_dataset_identities`) name the same pretraining pairs, judged by the most
    precise kind both have, and the words for that kind's two values."""
    kind = next(k for k in a if k in b)  # ("path" is always there)
    return a[kind] == b[kind], f"{kind} {b[kind]} vs {a[kind]}"


def _add_numbers(run: Run, source: str, result: dict) -> None:
    meta, rows = result.get("meta") or {}, result.get("rows") or []
    if source == "retrieval":
        for row in rows:
            scoring = "itc" if row.get("scoring") == "itc" else "rerank"
            prefix = ("" if row.get("model") in (None, "pretrained") else f"{row['model']}/") + scoring + ":"
            settings = {
                **{k: meta.get(k) for k in EVALUATION_KEYS["retrieval"]},
                **{k: row[k] for k in ("max_text_length", "resolution", "scoring") if k in row},
            }
            numbers = {
                k: float(v)
                for k, v in row.items()
                if _is_number(v) and k not in ("resolution", "max_text_length") and not k.endswith(("_lo", "_hi"))
            }
            for key in list(numbers):  # both directions averaged: R@1 = (i2t R@1 + t2i R@1) / 2, oracle_R@1, ...
                if "i2t_" in key and key.replace("i2t_", "t2i_") in numbers:
                    numbers[key.replace("i2t_", "", 1)] = (numbers[key] + numbers[key.replace("i2t_", "t2i_")]) / 2
            for key, value in numbers.items():
                name = prefix + key
                run.metrics[name], run.settings[name] = value, settings
                n = meta.get("images") if "i2t_" in key else meta.get("texts") if "t2i_" in key else None
                if n:
                    run.counts[name] = int(n)
    elif source == "vqa":
        for row in rows:
            if _is_number(row.get("accuracy")):
                run.metrics["vqa:accuracy"] = float(row["accuracy"])
                run.settings["vqa:accuracy"] = {
                    **{k: meta.get(k) for k in EVALUATION_KEYS["vqa"]},
                    "split": row.get("split"),
                    "questions": row.get("questions"),
                }
                run.counts["vqa:accuracy"] = int(row.get("questions") or 0)
    elif source == "nlvr2":
        for row in rows:
            if _is_number(row.get("accuracy")):
                name = f"nlvr2:{row.get('split')}"
                run.metrics[name] = float(row["accuracy"])
                run.settings[name] = {
                    **{k: meta.get(k) for k in EVALUATION_KEYS["nlvr2"]},
                    "statements": row.get("statements"),
                }
                run.counts[name] = int(row.get("statements") or 0)
    elif source == "audit":  # the used negatives' false-negative rates, percent
        settings = {k: result.get(k) for k in EVALUATION_KEYS["audit"]}
        for row in result.get("overall") or []:
            for key, suffix in (("rate", ""), ("oracle_rate", "_oracle")):
                if _is_number(row.get(key)):
                    name = f"audit:{row['kind']}_fn{suffix}"
                    run.metrics[name], run.settings[name] = 100.0 * float(row[key]), settings
                    run.counts[name] = int(row.get("negatives") or 0)


def _add_flags(run: Run, path: Path) -> None:
    """``flags:<key>`` from the last epoch's ``kind: false_negatives`` record of ``metrics.jsonl`` (a record written
    again by a resumed run replaces the earlier one); nothing where the run has none."""
    records = {r.get("epoch"): r for r in read_metrics(path) if r.get("kind") == "false_negatives"}
    if not records:
        return
    last = records[max(records)]
    for key, value in last.items():
        if key not in ("kind", "epoch", "step") and _is_number(value):
            run.metrics[f"flags:{key}"], run.settings[f"flags:{key}"] = float(value), {}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def metric_names(runs: Sequence[Run]) -> list[str]:
    """The metrics every run has, in the order the first run's results list them."""
    return [name for name in runs[0].metrics if all(name in r.metrics for r in runs)]


def label_runs(runs: Sequence[Run], labels: Sequence[str] = ()) -> None:
    """Give each run its method's label: ``NAME=GLOB`` from ``labels`` where the run's path matches GLOB, else the
    recipe's name followed by the config settings (``key=value``) that tell it apart from other runs of that
    recipe."""
    rules = []
    for rule in labels:
        name, sep, pattern = rule.partition("=")
        if not sep or not name or not pattern:
            raise FalconError(f"--label {rule}: expected NAME=GLOB, e.g. --label falcon='runs/falcon-s*'")
        rules.append((name, pattern))
    identities = {id(r): _identity(r.config) for r in runs}
    for run in runs:
        matched = [
            name
            for name, pattern in rules
            if fnmatch.fnmatch(str(run.path), pattern) or fnmatch.fnmatch(run.path.name, pattern)
        ]
        if matched:
            run.label = matched[0]
            continue
        siblings = [identities[id(r)] for r in runs if r.recipe == run.recipe]
        mine = identities[id(run)]
        varying = sorted(k for k in set().union(*siblings) if len({repr(s.get(k)) for s in siblings}) > 1)
        run.label = " ".join([run.recipe, *(f"{k}={_value(mine.get(k))}" for k in varying)])


def _identity(config: dict) -> dict:
    """The settings that make a run's method: every config key but :data:`IDENTITY_IGNORED`, :data:`BUDGET_KEYS`
    and its inputs that other runs wrote (per seed: :func:`run_inputs`)."""
    flat = _flat(config)
    inputs = _artifacts(config)
    return {k: v for k, v in flat.items() if _method_key(k) and k not in inputs}


def _value(value) -> str:
    return "null" if value is None else json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def check_comparable(runs: Sequence[Run], metrics: Sequence[str], allow_mismatch: bool = False) -> list[str]:
    """Refuse (one line, naming the run and what differs) runs of other pretraining pairs, budgets or evaluation
    settings than the first run; with ``allow_mismatch`` return those lines as warnings instead. Also refuse two
    runs of one method and seed, and a metric some run lacks."""
    first = runs[0]
    problems = []
    for run in runs[1:]:
        same, words = same_pairs(first.dataset, run.dataset)
        if not same:
            problems.append(
                f"{run.path}: pretrained on other pairs than {first.path} ({words}); compare runs of one dataset"
            )
        a, b = _flat(first.config), _flat(run.config)
        for key in BUDGET_KEYS:
            if a.get(key) != b.get(key):
                problems.append(
                    f"{run.path}: another budget than {first.path} ({key}: {b.get(key)!r} vs "
                    f"{a.get(key)!r}); compare runs trained alike"
                )
                break
    for run in runs:  # an input made on other pairs (an auxiliary model of another world) is not this run's method
        for item in run.inputs:
            for producer, identities in item.producers:
                same, words = same_pairs(run.dataset, dict(identities))
                if not same:
                    problems.append(
                        f"{run.path}: its {item.key} comes from {producer}, trained on other pairs than "
                        f"it was ({words}); make its inputs from runs on its own pairs"
                    )
    check_inputs_alike(runs)
    for metric in metrics:
        missing = [r for r in runs if metric not in r.metrics]
        if len(missing) == len(runs):
            available = ", ".join(metric_names(runs)[:12]) or "none in common"
            raise FalconError(f"--metric {metric}: no run has it; the runs' results give: {available}")
        if missing and metric.startswith("flags:"):
            method = _flat(missing[0].config).get("pretrain.false_negatives.method") or "none"
            raise FalconError(
                f"{missing[0].path}: its method (pretrain.false_negatives.method={method}) gives no {metric}: "
                f"{FLAG_PRODUCERS}, on a shapes world only; compare the runs whose method gives it"
            )
        if missing:
            have = [m for m in missing[0].metrics if m.split(":")[0] == metric.split(":")[0]][:6]
            raise FalconError(
                f"{missing[0].path}: no {metric} in its results"
                + (f" (it has {', '.join(have)})" if have else "")
                + f"; evaluate it as the others were (e.g. falcon evaluate retrieval {missing[0].path}"
                + (" --rerank" if metric.startswith("rerank:") else "")
                + ")"
            )
        for run in runs[1:]:
            s, f = run.settings[metric], first.settings[metric]
            key = next((k for k in f if s.get(k) is not None and f[k] is not None and s[k] != f[k]), None)
            if key is not None:
                problems.append(
                    f"{run.path}: {metric} measured with {key} = {s.get(key)!r}, {first.path} with "
                    f"{f.get(key)!r}; evaluate the runs alike"
                )
    seen: dict[tuple[str, int], Path] = {}
    for run in runs:
        other = seen.setdefault((run.label, run.seed), run.path)
        if other != run.path:
            raise FalconError(
                f"{run.path}: the same method ({run.label}) and seed ({run.seed}) as {other}; give one "
                "run per method and seed, or tell them apart with --label NAME=GLOB"
            )
    problems = list(dict.fromkeys(problems))
    if problems and not allow_mismatch:
        raise FalconError(
            problems[0]
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            + "; --allow-mismatch compares them anyway and flags it in the report"
        )
    return problems


def check_inputs_alike(runs: Sequence[Run]) -> None:
    """Refuse (one line) a method whose seeds take an input from runs of different methods: seed 0's SRCL auxiliary
    from a uniform run, seed 1's from a GRIT run, say. Per-seed paths are expected; what made them must agree."""
    first: dict[str, Run] = {}
    for run in runs:
        other = first.setdefault(run.label, run)
        if other is run:
            continue
        mine, theirs = {i.key: i for i in run.inputs}, {i.key: i for i in other.inputs}
        for key in sorted(set(mine) | set(theirs)):
            a, b = theirs.get(key), mine.get(key)
            if a is None or b is None or a.identity != b.identity:
                mine_words, their_words = (i.source if i else "no file (not set)" for i in (b, a))
                detail = _first_difference(a.identity, b.identity) if a and b else None
                words = (
                    f"{run.path}'s {key} comes from {mine_words}, {other.path}'s from {their_words}"
                    if mine_words != their_words
                    else f"{run.path}'s {key} was made otherwise than {other.path}'s"
                )
                raise FalconError(
                    words + (f" ({detail})" if detail else "") + f", yet both are {run.label}: "
                    "the seeds of a method take their inputs from runs of one method; make them alike, "
                    "or tell the two apart with --label NAME=GLOB"
                )


def _first_difference(a: tuple, b: tuple) -> str | None:
    """The first setting that tells two :attr:`RunInput.identity` apart, in words."""
    if len(a) < 3 or len(b) < 3:  # (a missing file, or one outside any run: the words already say so)
        return None
    if a[0] != b[0]:
        return f"a {b[0]} run vs a {a[0]} run"
    settings_a, settings_b = dict(a[1]), dict(b[1])
    for key in sorted(set(settings_a) | set(settings_b)):
        if settings_a.get(key) != settings_b.get(key):
            return f"{key}: {settings_b.get(key)} vs {settings_a.get(key)}"
    nested_a, nested_b = dict(a[2]), dict(b[2])
    for key in sorted(set(nested_a) | set(nested_b)):
        if nested_a.get(key) != nested_b.get(key):
            inner = _first_difference(nested_a.get(key) or ("none",), nested_b.get(key) or ("none",))
            return f"{key}: {inner}" if inner else key
    return None


@dataclass
class Comparison:
    """What :func:`compare_runs` found: per metric, one summary row per method and the per-seed values."""

    metrics: list[str]
    baseline: str
    methods: list[str]
    summary: list[dict]
    per_seed: list[dict]
    warnings: list[str]


def compare_runs(
    runs: Sequence[Run], metrics: Sequence[str], baseline: str | None = None, allow_mismatch: bool = False
) -> Comparison:
    """Each method's mean over its seeds with the t interval (one seed: the binomial interval over its queries),
    and its paired difference from ``baseline`` (default: the first run's method) over the seeds both ran."""
    warnings = check_comparable(runs, metrics, allow_mismatch)
    places = {r.trained_on for r in runs if r.trained_on}
    if len(places) > 1:  # (allowed: seeds trained on a GPU beside seeds trained on a CPU are still paired runs)
        warnings.append(
            f"the runs trained on {' and on '.join(sorted(places))}: such runs drift apart as two seeds "
            "would, so pair like with like where you can"
        )
    methods = list(dict.fromkeys(r.label for r in runs))
    baseline = baseline if baseline is not None else methods[0]
    if baseline not in methods:
        raise FalconError(f"--baseline {baseline}: no such method among the runs ({', '.join(methods)})")
    by_method = {m: {r.seed: r for r in runs if r.label == m} for m in methods}
    for method, seeds in by_method.items():
        if len(seeds) == 1:
            run = next(iter(seeds.values()))
            warnings.append(
                f"{run.path}: the only seed of {method}: one seed, no verdict; train more seeds of it "
                f"(the seed=N override; the baseline's too) for a paired interval"
            )
    summary, per_seed = [], []
    for metric in metrics:
        reference = by_method[baseline]
        for method in methods:
            seeds = by_method[method]
            values = [seeds[s].metrics[metric] for s in sorted(seeds)]
            m = mean_interval(values)
            lo, hi = (m.lo, m.hi) if m.n > 1 else single_run_interval(metric, values[0], next(iter(seeds.values())))
            row = {
                "metric": metric,
                "method": method,
                "seeds": m.n,
                "mean": m.mean,
                "std": m.std,
                "lo": lo,
                "hi": hi,
                "interval": "t over seeds" if m.n > 1 else "binomial over queries",
            }
            d = (
                None
                if method == baseline
                else paired_by_seed(
                    {s: r.metrics[metric] for s, r in seeds.items()},
                    {s: r.metrics[metric] for s, r in reference.items()},
                )
            )
            if d is not None:
                row.update(
                    {
                        "baseline": baseline,
                        "paired_seeds": d.n,
                        "difference": d.mean,
                        "difference_lo": d.lo,
                        "difference_hi": d.hi,
                        "positive": d.positive,
                        "t": d.t,
                        "verdict": _verdict_word(d.lo, d.hi, d.n),
                    }
                )
            elif method != baseline:
                row.update({"baseline": baseline, "paired_seeds": 0, "verdict": "no seed in common with the baseline"})
            summary.append(row)
            per_seed += [
                {
                    "metric": metric,
                    "method": method,
                    "seed": s,
                    "value": seeds[s].metrics[metric],
                    "run": str(seeds[s].path),
                }
                for s in sorted(seeds)
            ]
    return Comparison(list(metrics), baseline, methods, summary, per_seed, warnings)


def _verdict_word(lo: float, hi: float, n: int) -> str:
    """A word only where the interval excludes zero; ``—`` where it holds it."""
    verdict = interval_verdict(lo, hi, n)
    return "—" if verdict == "no difference" else verdict


def single_run_interval(metric: str, value: float, run: Run) -> tuple[float, float]:
    """One run's 95% interval over its queries: Wilson's for a one-direction percentage; for a two-direction mean
    (``R@1`` = the mean of i2t and t2i) the normal interval of the mean of two independent proportions; nan where
    the count of queries is unknown."""
    if metric in run.counts and run.counts[metric] > 0:
        return wilson_interval(value, run.counts[metric])
    key = metric.split(":", 1)[-1]
    prefix = metric[: len(metric) - len(key)]
    parts = []
    for direction in ("i2t_", "t2i_"):
        for name in (f"{prefix}{direction}{key}", f"{prefix}{key.replace('oracle_', 'oracle_' + direction, 1)}"):
            if name in run.counts and name != metric:
                parts.append((run.metrics[name] / 100.0, run.counts[name]))
                break
    if len(parts) != 2:
        return (float("nan"), float("nan"))
    half = Z95 * math.sqrt(sum(p * (1 - p) / n for p, n in parts)) / 2
    return (100.0 * max(0.0, value / 100 - half), 100.0 * min(1.0, value / 100 + half))


def _interval(mean: float, lo: float, hi: float, signed: bool = False) -> str:
    number = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return (
        number
        if lo != lo or hi != hi
        else f"{number} [{lo:+.2f}, {hi:+.2f}]"
        if signed
        else f"{number} [{lo:.2f}, {hi:.2f}]"
    )


def markdown(comparison: Comparison) -> str:
    """The comparison as Markdown: per metric, one row per method (mean and 95% interval over seeds; its paired
    difference from the baseline with the paired-t 95% interval, the seeds paired, on how many it is positive, and
    a verdict only where the interval excludes zero), then any warnings."""
    lines = [
        "# Runs compared over seeds",
        "",
        f"Baseline: **{comparison.baseline}**. Means with their 95% interval over seeds (Student's t; one seed: "
        "the binomial interval over its queries). Differences are paired by seed, with the paired-t 95% "
        "interval; a verdict is given only where that interval excludes zero.",
        "",
    ]
    for metric in comparison.metrics:
        lines += [
            f"## {metric}",
            "",
            "| method | seeds | mean [95% CI] | − baseline [95% CI] | paired seeds | positive | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in (r for r in comparison.summary if r["metric"] == metric):
            if row["method"] == comparison.baseline:
                diff, n, positive, verdict = "(baseline)", "", "", ""
            elif row.get("paired_seeds"):
                diff = _interval(row["difference"], row["difference_lo"], row["difference_hi"], signed=True)
                n, positive, verdict = row["paired_seeds"], f"{row['positive']}/{row['paired_seeds']}", row["verdict"]
            else:
                diff, n, positive, verdict = "", 0, "", row["verdict"]
            lines.append(
                f"| {row['method']} | {row['seeds']} | {_interval(row['mean'], row['lo'], row['hi'])} | {diff} "
                f"| {n} | {positive} | {verdict} |"
            )
        lines.append("")
    if comparison.warnings:
        lines += ["## Warnings", "", *(f"- {w}" for w in comparison.warnings), ""]
    lines += ["## Runs", "", "| method | seed | run |", "|---|---|---|"]
    seen = set()
    for row in comparison.per_seed:
        if (row["method"], row["seed"]) not in seen:
            seen.add((row["method"], row["seed"]))
            lines.append(f"| {row['method']} | {row['seed']} | {row['run']} |")
    return "\n".join(lines) + "\n"


def figure(comparison: Comparison, path: str | Path) -> Path:
    """Per metric, two panels: each method's per-seed values with its mean and interval, and each method's per-seed
    differences from the baseline with the paired interval (a dashed line at zero)."""
    n = len(comparison.metrics)
    fig = Figure(figsize=(11, 0.6 + (1.0 + 0.45 * len(comparison.methods)) * n))
    axes = fig.subplots(n, 2, squeeze=False)
    for (left, right), metric in zip(axes, comparison.metrics):
        rows = {r["method"]: r for r in comparison.summary if r["metric"] == metric}
        for y, method in enumerate(comparison.methods):
            row = rows[method]
            values = [r["value"] for r in comparison.per_seed if r["metric"] == metric and r["method"] == method]
            left.scatter(values, [y] * len(values), s=14, color="0.55", zorder=2)
            if row["lo"] == row["lo"]:
                left.plot([row["lo"], row["hi"]], [y, y], color="C0", lw=2.5, zorder=3)
            left.scatter([row["mean"]], [y], color="C0", marker="D", s=30, zorder=4)
            if row.get("paired_seeds"):
                seeds = {
                    r["seed"]: r["value"]
                    for r in comparison.per_seed
                    if r["metric"] == metric and r["method"] == method
                }
                base = {
                    r["seed"]: r["value"]
                    for r in comparison.per_seed
                    if r["metric"] == metric and r["method"] == comparison.baseline
                }
                diffs = [seeds[s] - base[s] for s in seeds if s in base]
                colour = {"higher": "C2", "lower": "C3"}.get(row["verdict"], "C0")
                right.scatter(diffs, [y] * len(diffs), s=14, color="0.55", zorder=2)
                if row["difference_lo"] == row["difference_lo"]:
                    right.plot([row["difference_lo"], row["difference_hi"]], [y, y], color=colour, lw=2.5, zorder=3)
                right.scatter([row["difference"]], [y], color=colour, marker="D", s=30, zorder=4)
        for ax in (left, right):
            ax.set_yticks(range(len(comparison.methods)))
            ax.set_yticklabels(comparison.methods if ax is left else [""] * len(comparison.methods), fontsize=8)
            ax.set_ylim(len(comparison.methods) - 0.5, -0.5)
            ax.grid(axis="x", alpha=0.3)
        right.axvline(0, color="0.3", ls="--", lw=1)
        left.set_title(f"{metric}: per seed (grey), mean and 95% interval", fontsize=9)
        right.set_title(f"− {comparison.baseline}, paired by seed, 95% interval", fontsize=9)
    FigureCanvasAgg(fig)  # (headless, no pyplot state: as falcon_cli/reporting/figures.py draws)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    return Path(path)


def write_comparison(comparison: Comparison, out_dir: str | Path) -> Path:
    """``comparison.md``, ``comparison.csv`` (a row per metric and method), ``per_seed.csv`` and ``comparison.png``
    into ``out_dir``, replaced whole (atomically: an interrupted write leaves the old directory)."""
    with atomic_dir(out_dir) as out:
        write_text(out / "comparison.md", markdown(comparison))
        write_text(out / "comparison.csv", pd.DataFrame(comparison.summary).to_csv(index=False, float_format="%.6f"))
        write_text(out / "per_seed.csv", pd.DataFrame(comparison.per_seed).to_csv(index=False, float_format="%.6f"))
        figure(comparison, out / "comparison.png")
    return Path(out_dir)


__all__ = [
    "Run",
    "read_run",
    "shapes_world_fingerprint",
    "label_runs",
    "metric_names",
    "check_comparable",
    "compare_runs",
    "Comparison",
    "single_run_interval",
    "markdown",
    "figure",
    "write_comparison",
]
