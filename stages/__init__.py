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
from falcon_cli.errors import Refused
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime.loggers import require as require_loggers
from falcon_cli.runtime.precision import pick_device
from falcon_cli.runtime.run_dir import MANIFEST, RunDirectory, now

log = logging.getLogger("falcon")


def stage_function(name: str) -> Callable[[Recipe, RunDirectory], dict]:
    """The ``run`` function of stage ``name`` (imported lazily: stages pull in heavy libraries)."""
    return importlib.import_module(f"stages.{name}").run


def join_processes(config: Recipe, run_dir, command: str, **options) -> None:
    """Under torchrun: join the process group and check that every rank (every node) was launched with the same
    resolved config, run directory, command and options, before anything is written to the run directory
    (:func:`~falcon_cli.runtime.distributed.check_same_launch`: one line naming the node that differs). A no-op
    in a single process. The CLI calls it before opening the run directory; :func:`run_stages` checks again."""
    D.init_distributed(pick_device(config.pretrain.device).type)
    D.check_same_launch(launch(config, run_dir, command=command, **options))


def launch(config: Recipe, run_dir, **options) -> dict:
    """What every rank must agree on: the resolved config, the run directory (absolute) and the options."""
    return {**config.model_dump(mode="json"), "--run-dir": os.path.abspath(run_dir),
            **{f"--{key.replace('_', '-')}": value for key, value in options.items()}}


def run_stages(config: Recipe, run: RunDirectory, stages: list[str] | None = None, **options) -> dict[str, dict]:
    """Run ``stages`` (default: the recipe's) in order, recording each in the manifest.

    ``options`` (e.g. ``resume=True``) go to every stage that accepts them.

    The run is marked ``failed`` (and the error re-raised) if a stage raises, ``completed`` otherwise; a
    stage that raises :class:`~falcon_cli.errors.Refused` leaves the run's record as it was before the command.
    """
    # Under torchrun every rank runs the stages: join the process group first, so stages can
    # leave shared work (generating data, writing artifacts) to rank 0 and wait at a barrier.
    D.init_distributed(pick_device(config.pretrain.device).type)
    place_dataset(config, run.path)  # (the CLI placed it before recording the config; this serves direct callers)
    results: dict[str, dict] = {}
    try:
        # Every rank reads back what rank 0 writes (checkpoints, search spaces, embeddings): the run directory must be
        # the same on every node (a shared filesystem); then every rank must run the same stages with the same config.
        D.check_shared_file(run.path / MANIFEST, "run directory")
        D.check_same_launch(launch(config, run.path, stages=stages or list(config.stages), **options))
        # The optional loggers' packages before the first stage, not after the data stage's minutes: one line naming the extra.
        for stage, section in (("pretrain", config.pretrain), ("finetune", config.finetune)):
            if stage in (stages or config.stages):
                require_loggers(section.loggers, f"{stage}.loggers")
        for name in stages or list(config.stages):
            start = now()
            log.info("stage %s: start", name)
            try:
                function = stage_function(name)
                accepted = inspect.signature(function).parameters
                results[name] = function(config, run, **{k: v for k, v in options.items() if k in accepted})
            except Refused:
                raise
            except BaseException as exc:
                log.error("stage %s failed: %s", name, exc or type(exc).__name__)
                run.record_stage(name, start=start, status="failed")
                raise
            run.record_stage(name, start=start, status="completed", result=results[name])
            log.info("stage %s: done", name)
    except Refused:
        run.restore()  # refused before it changed anything: the record stays as it was
        raise
    except BaseException:
        run.close("failed")
        raise
    finally:
        D.shutdown()
    run.close("completed")
    return results
