"""Where a training run's numbers go besides ``metrics.jsonl``: TensorBoard, Weights & Biases, MLflow.

``pretrain.logging.loggers`` / ``finetune.loggers`` name them (``jsonl`` is always written). :class:`RunLoggers`
holds the configured sinks of one training log (rank 0 only) and gives each the same three things:

- scalars: every numeric value of every ``metrics.jsonl`` record, tagged ``<kind>/<key>`` (``train/loss``,
  ``epoch_summary/q_mean``, ``zero_shot/mean``, ...; step records are ``train``);
- histograms: the q's a quantile composer used in an epoch (``q``); MLflow has none, it skips them;
- images: figures the stage wrote (``figures/q_over_training.png``, the audit's figures).

Each sink writes under the training log's ``loggers/`` directory (``<run>/loggers/<name>/``; fine-tuning:
``<run>/finetune/<task>/loggers/<name>/``). The libraries are optional extras, imported only when named
(:func:`require` checks them before training: a one-line error names the extra to install).

A resumed run rewrites what the killed run logged past its checkpoint: ``metrics.jsonl`` drops those
lines, TensorBoard purges those events (``purge_step``); wandb and MLflow continue the same run (its id
is kept in the sink's directory) but cannot take back points, so they keep the killed run's points past
the checkpoint (docs/monitoring.md).
"""

from __future__ import annotations

import atexit
import importlib
import math
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal, Protocol

from falcon_cli.errors import FalconError

if TYPE_CHECKING:  # (numpy is imported where a histogram or an image is logged: the config schema reads LoggerName)
    import numpy as np

LoggerName = Literal["jsonl", "tensorboard", "wandb", "mlflow"]
"""The loggers a training section can name."""

EXTRAS = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow.tracking", "mlflow"),
}
"""Each optional logger: the module it imports, and the ``falcon-vlp`` extra that installs it."""


def require(names: Iterable[str], what: str) -> None:
    """Import every optional logger of ``names`` now (before training); a missing one is a one-line
    FalconError naming ``what`` (the config key, e.g. ``pretrain.logging.loggers``) and the extra to install."""
    for name in names:
        if name in EXTRAS:
            _import(name, what)


def _import(name: str, what: str):
    module, extra = EXTRAS[name]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise FalconError(
            f"{what} names '{name}' but the package is not installed ({exc}); pip install 'falcon-vlp[{extra}]'"
        ) from None


def scalar_tags(record: dict[str, Any]) -> dict[str, float]:
    """The numeric values of a ``metrics.jsonl`` record as ``<kind>/<key>`` tags (``train`` for step
    records); ``step``, ``epoch`` and ``kind``, strings, booleans, None and non-finite values are left out."""
    group = record.get("kind") or "train"
    tags = {}
    for key, value in record.items():
        if key in ("step", "epoch", "kind"):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            tags[f"{group}/{key}"] = float(value)
    return tags


class Sink(Protocol):
    """One logger: numbers, a histogram, an image (a PNG file), and closing."""

    def scalars(self, values: dict[str, float], step: int) -> None: ...
    def histogram(self, tag: str, values: np.ndarray, step: int) -> None: ...
    def image(self, tag: str, path: Path, step: int) -> None: ...
    def close(self) -> None: ...


class TensorBoardSink:
    """``SummaryWriter`` event files in ``directory``; a resumed run purges events past its checkpoint."""

    def __init__(self, directory: Path, *, start_step: int, **_):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            log_dir=str(directory), purge_step=start_step + 1 if start_step else None, flush_secs=30
        )

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        self.writer.add_histogram(tag, values, step)

    def image(self, tag: str, path: Path, step: int) -> None:
        self.writer.add_image(tag, _pixels(path), step, dataformats="HWC")

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A wandb run in ``directory`` (offline unless ``WANDB_MODE`` says otherwise); its id is kept in
    ``directory/run_id`` so a resumed run continues it (a fresh start begins a new one)."""

    def __init__(self, directory: Path, *, start_step: int, name: str, config: dict | None, **_):
        import wandb

        self.wandb = wandb
        run_id = _run_id(directory, start_step, lambda: uuid.uuid4().hex[:8])
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "falcon"),
            name=name,
            id=run_id,
            resume="allow",
            dir=str(directory),
            config=config,
            mode=os.environ.get("WANDB_MODE", "offline"),
            settings=wandb.Settings(silent=True, console="off", save_code=False),
        )

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        self.run.log({tag: self.wandb.Histogram(values)}, step=step)

    def image(self, tag: str, path: Path, step: int) -> None:
        self.run.log({tag: self.wandb.Image(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run: at ``MLFLOW_TRACKING_URI`` if set, else a file store in ``directory``; its id is kept
    in ``directory/run_id`` so a resumed run continues it. Histograms are skipped; images are artifacts."""

    def __init__(self, directory: Path, *, start_step: int, name: str, config: dict | None, **_):
        import time

        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # MLflow 3 keeps its file store in maintenance mode behind this opt-out
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (directory / "mlruns").resolve().as_uri()
        self.client, self.metric, self.clock = MlflowClient(tracking_uri=uri), Metric, time.time
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "falcon")
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)

        def create() -> str:
            return self.client.create_run(experiment_id, run_name=name).info.run_id

        self.run_id = _run_id(directory, start_step, create)
        if start_step:
            self.client.update_run(self.run_id, status="RUNNING")

    def scalars(self, values: dict[str, float], step: int) -> None:
        now = int(self.clock() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[self.metric(tag, value, now, step) for tag, value in values.items()]
        )

    def histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        pass  # (MLflow has no histograms)

    def image(self, tag: str, path: Path, step: int) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path=str(Path(tag).parent))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


SINKS = {"tensorboard": TensorBoardSink, "wandb": WandbSink, "mlflow": MlflowSink}


class RunLoggers:
    """The configured sinks of one training log (empty off rank 0, or with only ``jsonl``).

    Construction checks the packages (every rank, so all stop alike); :meth:`open` starts the sinks at the
    training state's step (0: a fresh start); :meth:`MetricsLog.truncate_after` calls it. Writing before
    :meth:`open` opens them at step 0. Closed by :meth:`close`, or at exit.

    Args:
        names: the configured loggers (``pretrain.logging.loggers``).
        directory: where each sink writes its ``<name>/`` directory (``<run>/loggers``).
        what: the config key, for errors (``pretrain.logging.loggers``).
        name: the run's name in wandb and MLflow.
        config: the run's settings, recorded by wandb.
        main: whether this process writes (rank 0).
    """

    def __init__(
        self,
        names: Iterable[str],
        directory: str | Path,
        *,
        what: str,
        name: str,
        config: dict | None = None,
        main: bool = True,
    ):
        self.names = [n for n in dict.fromkeys(names) if n in SINKS]
        require(self.names, what)
        self.directory, self.what, self.name, self.config = Path(directory), what, name, config
        self.main = main
        self.sinks: dict[str, Sink] | None = None

    def __bool__(self) -> bool:
        """Whether anything besides ``metrics.jsonl`` is written here."""
        return self.main and bool(self.names)

    def open(self, start_step: int = 0) -> None:
        """Start the sinks; ``start_step`` > 0 resumes (TensorBoard purges later events, wandb and MLflow
        continue their run)."""
        if not self or self.sinks is not None:
            return
        self.sinks = {}
        atexit.register(self.close)
        for name in self.names:
            folder = self.directory / name
            folder.mkdir(parents=True, exist_ok=True)
            try:
                self.sinks[name] = SINKS[name](folder, start_step=start_step, name=self.name, config=self.config)
            except FalconError:
                raise
            except Exception as exc:  # a logger that cannot start (a bad MLFLOW_TRACKING_URI, wandb login) says so
                raise FalconError(
                    f"{self.what}: {name} could not start in {folder}: "
                    f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                ) from exc

    def _each(self, method: str, *args) -> None:
        if not self:
            return
        self.open()
        for sink in self.sinks.values():
            getattr(sink, method)(*args)

    def scalars(self, record: dict[str, Any]) -> None:
        """A ``metrics.jsonl`` record's numbers (:func:`scalar_tags`) at its ``step``."""
        if self and "step" in record:
            tags = scalar_tags(record)
            if tags:
                self._each("scalars", tags, int(record["step"]))

    def histogram(self, tag: str, values: Any, step: int) -> None:
        """A histogram of ``values`` (non-finite ones left out; nothing when none is left)."""
        import numpy as np

        values = np.asarray(values, dtype=np.float64).ravel()
        values = values[np.isfinite(values)]
        if len(values):
            self._each("histogram", tag, values, int(step))

    def image(self, tag: str, path: str | Path, step: int) -> None:
        """A PNG file the stage wrote (nothing if it is missing)."""
        if Path(path).is_file():
            self._each("image", tag, Path(path), int(step))

    def close(self) -> None:
        """Flush and close every sink (idempotent)."""
        sinks, self.sinks = self.sinks, None
        for sink in (sinks or {}).values():
            sink.close()
        if sinks is not None:
            atexit.unregister(self.close)


def _run_id(directory: Path, start_step: int, create) -> str:
    """The run id kept in ``directory/run_id``: reused when resuming (``start_step`` > 0), else a new one."""
    file = directory / "run_id"
    if start_step and file.is_file() and file.read_text().strip():
        return file.read_text().strip()
    run_id = str(create())
    file.write_text(run_id + "\n")
    return run_id


def _pixels(path: Path) -> np.ndarray:
    """A PNG as an RGB HWC uint8 array."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


__all__ = ["EXTRAS", "LoggerName", "RunLoggers", "Sink", "require", "scalar_tags"]
