"""Registries: false-negative methods, batch composers and FALCON's rewards, each found by name.

A method is one file: its settings (a config section) and a function that builds it, registered with
:func:`false_negative_method`; a composer is a function registered with :func:`composer`; a reward is a loss whose
decrease is paid (:func:`loss_decrease_reward`) or a function that scores each pick (:func:`pick_reward`). falcon's own
register the same way, from ``falcon_cli/methods/``, which is loaded as the first plugin; a contributor's file is loaded
from ``$FALCON_PLUGINS`` (paths to ``.py`` files or importable module names, separated by ``os.pathsep``) or from a
package's ``falcon.plugins`` entry point (docs/extending.md). Plugins are loaded once, the first time a registry is
read.

Every problem is one line naming the file and the name: a plugin that fails to import, a name registered twice, an
unknown name (with the nearest registered names)."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

from falcon_cli.errors import FalconError

PLUGINS_ENV = "FALCON_PLUGINS"
"""The environment variable naming plugin files or modules (``os.pathsep``-separated)."""

ENTRY_POINT_GROUP = "falcon.plugins"
"""The entry-point group an installed package names its plugin modules in."""

BUILTIN_PLUGINS = ("falcon_cli.methods",)
"""falcon's own registrations, loaded first, as any plugin is."""

T = TypeVar("T")


@dataclass
class Registry(Generic[T]):
    """Named entries of one kind; :meth:`register` adds one, :meth:`get` finds one by name."""

    kind: str
    entries: dict[str, T] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)

    def register(self, name: str, entry: T, origin: str) -> None:
        """Add ``entry`` under ``name``; a name already taken is one line naming both files."""
        if name in self.entries:
            raise FalconError(
                f"{origin}: registers {self.kind} '{name}', which {self.origins[name]} registered already; "
                "choose another name"
            )
        self.entries[name] = entry
        self.origins[name] = origin

    def names(self) -> list[str]:
        """The registered names (plugins loaded first)."""
        load_plugins()
        return list(self.entries)

    def get(self, name: str) -> T:
        """The entry named ``name``; an unknown name is one line with the nearest registered names."""
        load_plugins()
        if name in self.entries:
            return self.entries[name]
        raise FalconError(unknown_name_message(self.kind, name, list(self.entries)))

    def __contains__(self, name: object) -> bool:
        load_plugins()
        return name in self.entries


def unknown_name_message(kind: str, name: str, names: list[str]) -> str:
    """``unknown <kind> 'x': did you mean 'y'? (registered: ...)``."""
    near = difflib.get_close_matches(name, names, n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(n) for n in near)}? " if near else ""
    return f"unknown {kind} '{name}': {hint}(registered: {', '.join(names)}; a plugin adds one: docs/extending.md)"


@dataclass(frozen=True)
class FalseNegativeMethod:
    """A false-negative method: how the losses treat likely false negatives.

    ``build(settings, context)`` returns the :class:`~falcon_cli.objectives.false_negatives.FalseNegatives` the
    objective calls (``settings``: the method's own section, an instance of ``config``; ``context``: a
    :class:`MethodContext` with the dataset, device, run, world and the whole
    pretrain section). The other fields say what the rest of falcon needs to know about it."""

    name: str
    config: type
    """Its settings, a config :class:`~falcon_cli.config.schema.base.Section`: ``pretrain.false_negatives.<name>``."""
    build: Callable[[Any, Any], Any]
    consistency_weight: float = 0.0
    """The weight of GRIT-VLP's ITC consistency term its paper trains with (``losses.itc_consistency_weight``'s
    default under it)."""
    scored: bool = True
    """Its decisions about negatives are scored against a shapes world's oracle (flags or weights)."""
    capturable: bool = True
    """It can run inside a captured step (``runtime.graph_step``); False for a method that asks the host mid-step."""
    same_image_mask: bool = False
    """It combines with ``false_negatives.same_image: mask`` (the masked ITC)."""
    check: Callable[[Any, Any], None] | None = None
    """``check(settings, pretrain)``: what its settings need of the rest of the run (a ValueError if not met)."""
    description: str = ""


@dataclass(frozen=True)
class MethodContext:
    """What a false-negative method's ``build(settings, context)`` is given besides its own settings: the run it is
    built for, every input checked before the first step."""

    pretrain: Any
    """The whole ``pretrain`` section (:class:`~falcon_cli.config.schema.PretrainConfig`), for a method that reads
    beyond its own section (MAFA's judge runs on ``runtime.device``)."""
    dataset: Any
    """The pretraining pairs (``pair_ids``, ``records``)."""
    spec: Any
    """The dataset's ``dataset.yaml`` (:class:`~falcon_cli.data.spec.DatasetSpec`)."""
    data_dir: Any
    """``data.dataset``: where the dataset lives."""
    device: Any
    """The training device (a ``torch.device``)."""
    run_path: Path
    """The run directory."""
    world: Path | None
    """The shapes world the dataset was generated from (its oracle knows the truth), or None."""
    warn: Callable[[str], None] = print
    """Prints one warning line."""


FALSE_NEGATIVE_METHODS: Registry[FalseNegativeMethod] = Registry("false-negative method")
"""``pretrain.false_negatives.method``: every method but ``none`` (the framework's plain ITC)."""


@dataclass(frozen=True)
class Composer:
    """A batch composer: ``build(pretrain, truth, source)`` returns the
    :class:`~falcon_cli.sampling.composers.BatchComposer` that composes each epoch's batches (``pretrain``: the
    pretrain section, whose ``composer`` section holds the settings; ``truth``: a shapes world's oracle or None;
    ``source``: FALCON's q source or None)."""

    name: str
    build: Callable[..., Any]
    draws_q: bool = False
    """It draws a quantile q per anchor or batch (``composer.quantile_scale`` applies; the q's are logged)."""
    search_spaces: bool = True
    """It composes inside search spaces (``composer.search_space_size``, a warm start's built spaces)."""
    description: str = ""


COMPOSERS: Registry[Composer] = Registry("composer")
"""``pretrain.composer.name``: how an epoch's batches are composed."""


def composer(name: str, **properties: Any) -> Callable:
    """Register the decorated ``build(pretrain, truth, source)`` as the batch composer ``name`` (``properties``:
    the other fields of :class:`Composer`)."""

    def register(build: Callable) -> Callable:
        COMPOSERS.register(name, Composer(name=name, build=build, **properties), _origin())
        return build

    return register


@dataclass(frozen=True)
class Reward:
    """A FALCON reward: what the scheduler is paid for a batch it composed (``pretrain.scheduler.reward.name``).

    Of one of two kinds. A *loss decrease* (``parts``): Algorithm 2's Δ, the fall of the sum of these losses (names
    the objective's ``measure`` returns) on the batch over the model's update, per pair when ``per_pair``. A *pick
    score* (``score``): ``score(context)`` (a :class:`PickScoring`) returns the worth of each slot's pick ``[b]``
    (slot 0, no pick: 0) and what the judge said of each pick (``[b - 1, 2]``: its match probability and the charge
    per unit of weight) or None, read from the step's own forward; with ``score_levels(record, settings, grid)`` it
    can also score the pick every q of a grid would have made (``scheduler.update.credit: levels``)."""

    name: str
    parts: tuple[str, ...] = ()
    """A loss decrease: the losses whose sum's decrease is paid."""
    score: Callable[[Any], Any] | None = None
    """A pick score: ``score(PickScoring) -> (worth [b], judged [b - 1, 2] | None)``."""
    score_levels: Callable[..., Any] | None = None
    """``score_levels(record, settings, grid) -> [k, L]``: every level's pick scored from the composer's record."""
    prepare: Callable[[Any], Any] | None = None
    """A pick score's measurement before the model's update: ``prepare(PickScoring)`` (its ``out`` and ``composed``
    None) returns what ``score`` then finds in ``PickScoring.prepared`` (a per-pick loss at θ_k, say)."""
    from_training_loss: bool = True
    """A loss decrease whose L(θ_k) is the training forward's own loss (False: a no-grad pass measures it before the
    update, as ``alignment``'s, which is no training loss)."""
    per_pair: bool = True
    """Measured per pair, so that a per-step ``scheduler.update.credit`` can hand it to single q's."""
    frameworks: tuple[str, ...] = ("albef", "blip2", "dual")
    """The frameworks whose models have what it measures."""
    judged: bool = False
    """It charges a judge's verdict on each pick (``scheduler.reward.hardness: rank`` and ``itm_charge`` apply)."""
    oracle: bool = False
    """Its judge is a shapes world's oracle: the dataset must name its world."""
    description: str = ""

    @property
    def credits(self) -> tuple[str, ...]:
        """The ``scheduler.update.credit`` values it can be credited with."""
        if self.score is not None:
            return ("chosen", "levels") if self.score_levels is not None else ("chosen",)
        return ("batch", "anchor", "chosen", "pair") if self.per_pair else ("batch",)


@dataclass(frozen=True)
class PickScoring:
    """What a pick-scoring reward's ``score`` is given for one step, after the model's update."""

    objective: Any
    """The framework's objective (``match_probability``: its ITM head's judgement of pairs)."""
    out: Any
    """The training forward's output (``image_feat``, ``text_feat``: θ_k's features of the batch)."""
    inputs: tuple
    """(images, input_ids, attention_mask, mlm mask) of the batch."""
    composed: Any
    """The composer's :class:`~falcon_cli.sampling.composers.Batch` (``quantile_rank``, ``q``, ``chosen_is_fn``)."""
    settings: Any
    """``pretrain.scheduler.reward``."""
    precision: str
    device: Any
    prepared: Any = None
    """What the reward's ``prepare`` measured before the update (None without one)."""


REWARDS: Registry[Reward] = Registry("reward")
"""``pretrain.scheduler.reward.name``: what FALCON's scheduler is paid."""


def loss_decrease_reward(name: str, parts: tuple[str, ...], **properties: Any) -> None:
    """Register the reward ``name``: the decrease of the sum of the losses ``parts`` over the model's update
    (``properties``: the other fields of :class:`Reward`)."""
    REWARDS.register(name, Reward(name=name, parts=tuple(parts), **properties), _origin())


def pick_reward(name: str, **properties: Any) -> Callable:
    """Register the decorated ``score(PickScoring)`` as the reward ``name`` (``properties``: the other fields of
    :class:`Reward`, ``score_levels`` among them)."""

    def register(score: Callable) -> Callable:
        REWARDS.register(name, Reward(name=name, score=score, **properties), _origin())
        return score

    return register


_CURRENT_ORIGIN: list[str] = []


def _origin() -> str:
    return _CURRENT_ORIGIN[-1] if _CURRENT_ORIGIN else "falcon_cli"


def false_negative_method(name: str, *, config: type, **properties: Any) -> Callable:
    """Register the decorated ``build(settings, context)`` as the false-negative method ``name`` (its settings
    ``config``; ``properties``: the other fields of :class:`FalseNegativeMethod`)."""

    def register(build: Callable) -> Callable:
        FALSE_NEGATIVE_METHODS.register(
            name, FalseNegativeMethod(name=name, config=config, build=build, **properties), _origin()
        )
        return build

    return register


_LOADED: list[bool] = []


def plugin_sources() -> list[str]:
    """What :func:`load_plugins` loads, in order: the built-ins, ``$FALCON_PLUGINS``, then entry points."""
    from importlib.metadata import entry_points

    env = [s for s in os.environ.get(PLUGINS_ENV, "").split(os.pathsep) if s.strip()]
    eps = [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return [*BUILTIN_PLUGINS, *env, *eps]


def load_plugins() -> None:
    """Import every plugin once (see the module docstring); a failure is one line naming the plugin."""
    if _LOADED:
        return
    _LOADED.append(True)
    try:
        for source in plugin_sources():
            _load(source)
    except BaseException:
        _LOADED.clear()  # (a failed load is tried again, and fails again with its line, in the next reader)
        raise


def _load(source: str) -> None:
    _CURRENT_ORIGIN.append(source)
    try:
        path = Path(source).expanduser()
        if source.endswith(".py") or os.sep in source:
            if not path.is_file():
                raise FalconError(f"{PLUGINS_ENV}: plugin file {path} not found")
            name = f"falcon_plugin_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
            if name in sys.modules:
                return
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except FalconError:
                del sys.modules[name]
                raise
            except Exception as exc:
                del sys.modules[name]
                raise FalconError(f"{path}: plugin failed to import ({type(exc).__name__}: {exc})") from None
        else:
            try:
                importlib.import_module(source)
            except FalconError:
                raise
            except Exception as exc:
                raise FalconError(f"plugin module {source}: failed to import ({type(exc).__name__}: {exc})") from None
    finally:
        _CURRENT_ORIGIN.pop()
