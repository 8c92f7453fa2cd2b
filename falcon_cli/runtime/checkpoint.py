"""Checkpoints: weights as safetensors, training state beside them, a ``latest`` pointer.

Layout::

    checkpoints/
      latest                  # text file: the name of the newest complete checkpoint
      000120/
        model.safetensors     # the model's weights (plain keys) + its config in the metadata
        momentum.safetensors  # momentum encoders and queue (only with itc: momentum)
        training_state.pt     # what every rank shares: optimizer, scaler, schedule position,
                              # composer, scheduler, epoch/step (tensors + plain values)
        rank-0.pt             # what each rank keeps of its own: RNG states, its embedding cache
        rank-1.pt             # shards, where its epoch stands (one file per rank; checkpoints
                              # before these held them in training_state.pt's "ranks")
        meta.json             # step, epoch, what produced it

A checkpoint directory is written atomically (temporary directory, then rename) and the
``latest`` pointer is updated only afterwards, so a kill at any moment leaves the previous
checkpoint usable. Under DDP every rank writes its own ``rank-<r>.pt`` into the temporary
directory rank 0 opened (:func:`checkpoint_staging`), and rank 0 renames it only once every
rank's file is written, so no rank's state is ever gathered on one process. Loading never
unpickles code: weights through safetensors, state through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from falcon_cli.artifacts.atomic import atomic_dir, write_json, write_text

# the layout and the weight files are below models and this module alike (re-exported here: one import for callers)
from falcon_cli.artifacts.checkpoints import LATEST, META, STATE, WEIGHTS, latest_checkpoint, rank_state_name  # noqa: F401
from falcon_cli.artifacts.state_dicts import load_weights, save_weights
from falcon_cli.errors import FalconError, Refused


def save_checkpoint(
    directory: str | Path,
    step: int,
    modules: dict[str, torch.nn.Module],
    state: dict[str, Any],
    meta: dict[str, Any],
    keep_last: int = 3,
    *,
    ranks: dict[int, dict[str, Any]] | None = None,
) -> Path:
    """Write ``checkpoints/<step>/`` atomically, point ``latest`` at it, keep the newest ``keep_last``.

    ``modules`` maps a file stem to a module: ``{"model": albef}`` gives ``model.safetensors``
    (with the model config in its metadata, so :func:`falcon_cli.models.model_from_weights`
    rebuilds it), and e.g. ``"momentum"`` for the momentum encoders and queue. ``ranks``: each
    rank's own state, ``{rank: state}``, written as ``rank-<r>.pt`` (:func:`save_rank_state`;
    ``state["world_size"]`` says how many ranks the checkpoint has).
    """
    with checkpoint_staging(directory, step, keep_last) as tmp:
        write_checkpoint(tmp, step, modules, state, meta)
        for rank, mine in (ranks or {}).items():
            save_rank_state(tmp, rank, mine, world=state.get("world_size", 1), step=step)
    return checkpoint_path(directory, step)


def checkpoint_path(directory: str | Path, step: int) -> Path:
    """Where checkpoint ``step`` of ``directory`` lives once written."""
    return Path(directory) / f"{step:08d}"


@contextlib.contextmanager
def checkpoint_staging(directory: str | Path, step: int, keep_last: int = 3) -> Iterator[Path]:
    """A temporary directory to write checkpoint ``step`` into (files of :func:`write_checkpoint` and
    :func:`save_rank_state`, from one process or several). When the block ends, it replaces
    ``checkpoints/<step>/`` whole, ``latest`` points at it and only the newest ``keep_last`` are kept; when the
    block raises, it goes and nothing else changes (the previous checkpoint stays whole and ``latest`` on it)."""
    root = Path(directory)
    target = checkpoint_path(root, step)
    with atomic_dir(target) as tmp:
        yield tmp
    write_text(root / LATEST, target.name + "\n")
    if keep_last > 0:
        for old in sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def write_checkpoint(
    directory: Path, step: int, modules: dict[str, torch.nn.Module], state: dict[str, Any], meta: dict[str, Any]
) -> None:
    """The weight files, ``training_state.pt`` and ``meta.json`` of a checkpoint, into ``directory`` (a staging
    directory: :func:`checkpoint_staging`)."""
    for name, module in modules.items():
        save_weights(module, directory / f"{name}.safetensors")
    torch.save(state, directory / STATE)
    write_json(directory / META, {"step": step, **meta})


def save_rank_state(directory: Path, rank: int, state: dict[str, Any], *, world: int, step: int) -> Path:
    """Rank ``rank``'s own state into ``directory`` (a staging directory) as ``rank-<r>.pt``, with the rank, world
    size and step it belongs to (checked on load: a file copied from another checkpoint is refused)."""
    path = directory / rank_state_name(rank)
    torch.save({"rank": rank, "world_size": world, "step": step, "state": state}, path)
    return path


def rewind_latest(directory: str | Path, before_step: int) -> Path | None:
    """Point ``latest`` at the newest kept checkpoint saved before ``before_step`` (removing the
    pointer when there is none, so ``--resume`` starts from scratch); returns it. For weights known
    to fail: a resume from them would only fail again."""
    root = Path(directory)
    earlier = (
        sorted(
            p
            for p in root.iterdir()
            if p.is_dir() and p.name.isdigit() and int(p.name) < before_step and (p / WEIGHTS).exists()
        )
        if root.is_dir()
        else []
    )
    if earlier:
        write_text(root / LATEST, earlier[-1].name + "\n")
        return earlier[-1]
    (root / LATEST).unlink(missing_ok=True)
    return None


def load_checkpoint_weights(checkpoint: str | Path, modules: dict[str, torch.nn.Module]) -> None:
    """Load each ``<name>.safetensors`` of a checkpoint directory into ``modules[name]`` (strict)."""
    for name, module in modules.items():
        path = Path(checkpoint) / f"{name}.safetensors"
        if not path.exists():
            raise FalconError(f"{path}: not found; the checkpoint was saved by another configuration")
        load_weights(module, path)


def load_training_state(checkpoint: str | Path) -> dict[str, Any]:
    """Load ``training_state.pt`` safely (``weights_only=True``: tensors and plain values only)."""
    path = Path(checkpoint) / STATE
    if not path.exists():
        raise FalconError(f"{path}: training state not found; cannot resume from {checkpoint}")
    return _load_state_file(path)


def _load_state_file(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, overwritten or not a checkpoint: never retry it unsafely
        if "unsupported global" in str(exc).lower():  # a pickled object, not a damaged file
            raise FalconError(
                f"{path}: holds more than tensors and plain values; refused (falcon never loads "
                "checkpoints in a way that could run code from them)"
            ) from None
        raise FalconError(f"{path}: damaged, cannot be read ({type(exc).__name__})") from None


def load_rank_state(checkpoint: str | Path, rank: int, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rank ``rank``'s own state in a checkpoint: its ``rank-<r>.pt`` or, in a checkpoint from before those, its
    entry of ``training_state.pt``'s ``ranks`` (``state``: that file, when already loaded). Safe as
    :func:`load_training_state`; a missing, damaged or foreign file raises :class:`FalconError`."""
    checkpoint = Path(checkpoint)
    state = load_training_state(checkpoint) if state is None else state
    world = state.get("world_size", 1)
    if "ranks" in state:
        ranks = state["ranks"]
        if not 0 <= rank < len(ranks):
            raise FalconError(f"{checkpoint / STATE}: holds the state of {len(ranks)} rank(s), not of rank {rank}")
        return ranks[rank]
    path = checkpoint / rank_state_name(rank)
    if not path.exists():
        raise FalconError(f"{path}: missing")
    loaded = _load_state_file(path)
    if not isinstance(loaded, dict) or "state" not in loaded:
        raise FalconError(f"{path}: not a rank's checkpoint state")
    expected = {"rank": rank, "world_size": world, "step": state.get("global_step", loaded.get("step"))}
    found = {key: loaded.get(key) for key in expected}
    if found != expected:
        raise FalconError(
            f"{path}: holds rank {found['rank']} of {found['world_size']} at step {found['step']}, "
            f"expected rank {rank} of {world} at step {expected['step']}"
        )
    return loaded["state"]


RANK_STATE = "this_rank"
"""The key under which :func:`resume_point` (given a rank) returns that rank's own state inside the training state."""


def resume_point(
    directory: str | Path,
    modules: dict[str, torch.nn.Module],
    *,
    rank: int | None = None,
    world: int | None = None,
    agree: Callable[[Any], list] | None = None,
) -> tuple[Path, dict[str, Any], list[str]] | None:
    """What ``--resume`` continues from: the checkpoint ``latest`` points to or, when it is damaged
    (a kill or a full disk while it was copied, a truncated file), the newest intact one kept before it.
    Loads its weights into ``modules`` and returns (checkpoint, training state, the damaged ones passed
    over, each with why); None when there is no checkpoint. Nothing on disk changes.

    ``rank``: this rank's own state (:func:`load_rank_state`) must load too; it is returned in the training state
    under :data:`RANK_STATE`. ``world``: a checkpoint saved by another number of processes is refused
    (:class:`Refused`, one line) rather than passed over. ``agree``: under DDP, every rank's answer to a question,
    in rank order (a collective, e.g. :func:`falcon_cli.runtime.distributed.gather_objects`; every rank calls this
    together): the ranks take rank 0's list of checkpoints and pass over one that is damaged on any rank, so all
    resume from the same checkpoint (or all refuse)."""
    root = Path(directory)
    everyone = agree if agree is not None else (lambda mine: [mine])
    names = _candidates(root)
    names = everyone(names)[0]  # (rank 0's view of the directory, so that every rank tries the same ones in turn)
    if names is None:
        return None
    named, candidates = names
    damaged = [] if named in candidates else [f"{named} (missing)"]
    for name in candidates:
        checkpoint = root / name
        problem = refusal = state = None
        try:
            if not (checkpoint / WEIGHTS).exists():
                raise FalconError(f"{checkpoint / WEIGHTS}: missing")
            state = load_training_state(checkpoint)
            saved = state.get("world_size", 1)
            if world is not None and saved != world:
                refusal = (
                    f"{checkpoint}: saved with {saved} processes, resuming with {world}; resume with the "
                    "same number (nothing was changed)"
                )
            else:
                load_checkpoint_weights(checkpoint, modules)
                if rank is not None:
                    state[RANK_STATE] = load_rank_state(checkpoint, rank, state)
        except FalconError as exc:
            problem, state = str(exc), None
        verdicts = everyone((problem, refusal))
        refusals = [r for _, r in verdicts if r is not None]
        if refusals:
            raise Refused(refusals[0])
        problems = [(r, p) for r, (p, _) in enumerate(verdicts) if p is not None]
        if problems:
            state = None  # (before the next candidate is loaded: one state in memory at a time)
            where = f" on rank {problems[0][0]}" if len(verdicts) > 1 and len(problems) < len(verdicts) else ""
            damaged.append(f"{name} ({problems[0][1]}{where})")
            continue
        return checkpoint, state, damaged
    raise Refused(
        f"{root}: no intact checkpoint to resume from ({'; '.join(damaged)}); "
        "start again without --resume (add --overwrite to replace the run)"
    )


def _candidates(root: Path) -> tuple[str, list[str]] | None:
    """(the checkpoint ``latest`` names, the kept checkpoints to try in order: that one if present, then the older
    ones newest first); None when there is no ``latest``."""
    if not (root / LATEST).exists():
        return None
    named = (root / LATEST).read_text().strip()
    kept = sorted((p.name for p in root.iterdir() if p.is_dir() and p.name.isdigit()), reverse=True)
    return named, ([named] if (root / named).is_dir() else []) + [name for name in kept if name < named]
