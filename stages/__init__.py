"""Pipeline stages, one module each, meeting only through artifacts in the run directory.

Each stage module has ``run(config: Recipe, run: RunDirectory) -> dict``: it validates
its inputs before heavy work, writes only through the artifacts layer (rank 0), and
returns a small JSON-able summary that goes into the manifest. :func:`run_stages` is
the one place that runs stages in order and records them, used by ``falcon run`` and by
every single-stage command.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from typing import Callable

from falcon_cli.config.recipes import place_dataset
from falcon_cli.config.schema import Recipe
from falcon_cli.data.sources import split_sources
from falcon_cli.data.spec import load_spec
from falcon_cli.errors import FalconError, Preempted, Refused
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.loggers import require as require_loggers
from falcon_cli.runtime.precision import pick_device, resolve_precision
from falcon_cli.runtime.run_dir import MANIFEST, RunDirectory, now

log = logging.getLogger("falcon")


def stage_function(name: str) -> Callable[[Recipe, RunDirectory], dict]:
    """The ``run`` function of stage ``name`` (imported lazily: stages pull in heavy libraries)."""
    return importlib.import_module(f"stages.{name}").run


def join_processes(config: Recipe, run_dir, command: str, **options) -> None:
    """Under torchrun: join the process group and check that every rank (every node) was launched with the same
    resolved config, run directory, command and options, before anything is written to the run directory
    (:func:`~falcon_cli.runtime.distributed.check_same_launch`: one line naming the node that differs). A no-op
    in a single process. The CLI calls it before opening the run directory; :func:`run_stages` checks again.
    ``pretrain.runtime.dist_timeout`` bounds every collective of the command, and a lost rank stops every other
    (:func:`~falcon_cli.runtime.distributed.init_distributed`). A pretraining precision the device cannot train in is
    refused here too, before anything is written."""
    runtime = config.pretrain.runtime
    device = pick_device(runtime.device)
    if command == "pretrain" or (command == "run" and "pretrain" in config.stages):
        # a precision this machine cannot train in (fp16 on a CPU, bf16 on one without native bf16): refused before
        # the run directory or the data stage is written, not when the pretrain stage starts
        resolve_precision(runtime.precision, device)
    D.init_distributed(device.type, runtime.dist_timeout)
    D.check_same_launch(launch(config, run_dir, command=command, **options))


def needed_splits(config: Recipe, stages: list[str]) -> list[tuple[str, str, str]]:
    """The dataset splits that the stages after ``data`` will read, as ``(section, split, the key that asks for
    it)``: pretraining's evaluation split (its pairs the data stage checks), each fine-tuning task's training and
    selection splits, each evaluated task's splits."""
    needs = []
    if "pretrain" in stages and config.pretrain.eval.split is not None:
        needs.append(("retrieval", config.pretrain.eval.split, "pretrain.eval.split"))
    if "finetune" in stages:
        f = config.finetune
        for task in f.tasks:
            key = f"finetune.tasks names {task}"
            if task == "retrieval":
                needs += [("retrieval", "train", key), ("retrieval", f.retrieval.select_split, key)]
            elif task == "vqa":
                needs += [("vqa", split, key) for split in f.vqa.train_splits]
            elif task == "nlvr2":
                needs += [("nlvr2", "train", key), ("nlvr2", "dev", key)]
    if "evaluate" in stages:
        e = config.evaluate
        for task in e.tasks:
            key = f"evaluate.tasks names {task}"
            if task == "retrieval" and e.retrieval.split != "pretrain":
                needs.append(("retrieval", e.retrieval.split, key))
            elif task == "vqa":
                needs.append(("vqa", e.vqa.split, key))
            elif task == "nlvr2":
                needs += [("nlvr2", split, key) for split in e.nlvr2.splits]
    return needs


def check_needed_splits(config: Recipe, stages: list[str]) -> None:
    """Refuse, before the first stage after ``data`` starts, a recipe whose later stages need a split its dataset
    spec does not name (a retrieval-only COCO spec under a recipe that also fine-tunes VQA used to train for hours
    before stopping): one line naming the file, the missing key and the setting that needs it."""
    spec = load_spec(config.data.dataset)
    for section, split, why in needed_splits(config, stages):
        try:
            split_sources(spec, section, split)
        except FalconError as exc:
            raise FalconError(f"{exc} ({why}; checked before any stage trains)") from None


def launch(config: Recipe, run_dir, **options) -> dict:
    """What every rank must agree on: the resolved config, the run directory (absolute) and the options."""
    return {
        **config.model_dump(mode="json"),
        "--run-dir": os.path.abspath(run_dir),
        **{f"--{key.replace('_', '-')}": value for key, value in options.items()},
    }


def run_stages(config: Recipe, run: RunDirectory, stages: list[str] | None = None, **options) -> dict[str, dict]:
    """Run ``stages`` (default: the recipe's) in order, recording each in the manifest.

    ``options`` (e.g. ``resume=True``) go to every stage that accepts them.

    The run is marked ``failed`` (and the error re-raised) if a stage raises, ``completed`` otherwise; a
    stage that raises :class:`~falcon_cli.errors.Refused` leaves the run's record as it was before the command.
    Under torchrun this is where a rank's error surfaces: it is published to every other rank (which then stop with
    the same line), and a failed collective becomes one line naming the lost rank
    (:func:`~falcon_cli.runtime.distributed.surface`).
    """
    # Under torchrun every rank runs the stages: join the process group first, so stages can
    # leave shared work (generating data, writing artifacts) to rank 0 and wait at a barrier.
    D.init_distributed(pick_device(config.pretrain.runtime.device).type, config.pretrain.runtime.dist_timeout)
    place_dataset(config, run.path)  # (the CLI placed it before recording the config; this serves direct callers)
    results: dict[str, dict] = {}
    try:
        # Every rank reads back what rank 0 writes (checkpoints, search spaces, embeddings): the run directory must be
        # the same on every node (a shared filesystem); then every rank must run the same stages with the same config.
        D.check_shared_file(run.path / MANIFEST, "run directory")
        D.check_same_launch(launch(config, run.path, stages=stages or list(config.stages), **options))
        # The optional loggers' packages before the first stage, not after the data stage's minutes: one line
        # naming the extra.
        for stage, loggers, key in (
            ("pretrain", config.pretrain.logging.loggers, "pretrain.logging.loggers"),
            ("finetune", config.finetune.loggers, "finetune.loggers"),
        ):
            if stage in (stages or config.stages):
                require_loggers(loggers, key)
        order = stages or list(config.stages)
        for i, name in enumerate(order):
            if name != "data" and all(earlier == "data" for earlier in order[:i]):
                check_needed_splits(config, order[i:])  # (after the data stage: it may generate the dataset)
            start = now()
            log.info("stage %s: start", name)
            D.note_stage(name)  # (a lost rank's line says where the job stopped)
            try:
                function = stage_function(name)
                accepted = inspect.signature(function).parameters
                results[name] = function(config, run, **{k: v for k, v in options.items() if k in accepted})
            except Refused:
                raise
            except Preempted as exc:  # checkpointed where it stopped: --resume continues it
                log.warning("stage %s preempted: %s", name, exc)
                run.record_stage(name, start=start, status="preempted")
                raise
            except BaseException as exc:
                problem = D.surface(exc)  # every other rank learns first; a failed collective becomes one line
                log.error("stage %s failed: %s", name, problem or type(problem).__name__)
                run.record_stage(name, start=start, status="failed")
                if problem is not exc:
                    raise problem from exc
                raise
            run.record_stage(name, start=start, status="completed", result=results[name])
            log.info("stage %s: done", name)
    except Refused as exc:
        D.surface(exc)
        run.restore()  # refused before it changed anything: the record stays as it was
        raise
    except Preempted:
        run.close("preempted")
        raise
    except BaseException as exc:
        problem = D.surface(exc)
        run.close("failed")
        if problem is not exc:
            raise problem from exc
        raise
    finally:
        D.shutdown()
    run.close("completed")
    return results
