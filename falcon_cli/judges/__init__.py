"""Judges: score image–caption pairs with the probability that the caption matches the image.

Every judge has a ``name`` and ``score(pairs) -> float64[n]`` in [0, 1] (:class:`Judge`).
:func:`load_judge` builds one of the three kinds:

* ``blip`` — a BLIP ITM head (:class:`BlipJudge`), the paper's false-negative judge;
* ``oracle`` — the shapes world's ground truth (:class:`OracleJudge`), 0.0 / 1.0;
* ``checkpoint`` — a falcon checkpoint's own ITM head (:class:`CheckpointJudge`).

:func:`is_false_negative` turns scores into false-negative flags (``p > 0.5`` by default).
"""

from __future__ import annotations

from pathlib import Path

from falcon_cli.errors import FalconError
from falcon_cli.judges.base import DEFAULT_THRESHOLD, Judge, JudgedPair, is_false_negative
from falcon_cli.judges.blip import DEFAULT_BLIP_MODEL

JUDGE_KINDS = ("blip", "oracle", "checkpoint")
"""The kinds :func:`load_judge` accepts."""


def load_judge(
    kind: str,
    *,
    model: str | Path | None = None,
    world: str | Path | None = None,
    run: str | Path | None = None,
    device: str = "auto",
    fp16: bool = False,
    batch_size: int = 64,
    what: str = "judge_model",
) -> Judge:
    """Build a judge.

    ``blip``: ``model`` = hub id (``NAME@REVISION`` pins it) or local directory (default :data:`DEFAULT_BLIP_MODEL`;
    ``what``: the config key it came from, for errors and the run's record);
    ``oracle``: ``world`` = the shapes world directory; ``checkpoint``: ``run`` = a falcon
    run directory or checkpoint directory. ``device``, ``fp16`` (CUDA only) and
    ``batch_size`` apply to the model judges. Problems are one-line :class:`FalconError` s.
    """
    # (lazy: each judge's module pulls its own libraries, torchvision and transformers among them; load only
    # the one asked for)
    if kind == "blip":
        from falcon_cli.judges.blip import BlipJudge  # (lazy: see above)

        return BlipJudge(
            model if model is not None else DEFAULT_BLIP_MODEL,
            device=device,
            fp16=fp16,
            batch_size=batch_size,
            what=what,
        )
    if kind == "oracle":
        from falcon_cli.judges.oracle import OracleJudge  # (lazy: see above)

        if world is None:
            raise FalconError(
                "oracle judge: no shapes world given; pass the world directory (the one with scenes.parquet)"
            )
        return OracleJudge(world)
    if kind == "checkpoint":
        from falcon_cli.judges.checkpoint import CheckpointJudge  # (lazy: see above)

        if run is None:
            raise FalconError("checkpoint judge: no falcon run given; pass a run directory or a checkpoint directory")
        return CheckpointJudge(run, device=device, fp16=fp16, batch_size=batch_size)
    raise FalconError(f"unknown judge {kind!r}; use one of {', '.join(JUDGE_KINDS)}")


__all__ = [
    "DEFAULT_BLIP_MODEL",
    "DEFAULT_THRESHOLD",
    "JUDGE_KINDS",
    "Judge",
    "JudgedPair",
    "is_false_negative",
    "load_judge",
]
