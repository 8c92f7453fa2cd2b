"""Input paths in a config: relative to the working directory when given, absolute once resolved.

A run is read again later by other commands (``falcon evaluate runs/x``, ``falcon audit-false-negatives``,
``falcon finetune``), possibly from another working directory. So every config value that names
a file or directory on this machine is made absolute when the config is resolved, and the
resolved config (``config.yaml``, the manifest) says exactly which files a run used.

Schema fields declare themselves with an :class:`InputPath` marker in their annotation::

    dataset: Annotated[Path, InputPath()]                              # always a path
    text_weights: Annotated[str | None, InputPath(when="exists")]      # a hub id, or a local directory
    encoder: Annotated[str, InputPath(prefixes=("falcon:",))]          # a path after the prefix

:func:`absolute_input_paths` rewrites every marked value of a validated config.
"""

from __future__ import annotations

import functools
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel


@dataclass(frozen=True)
class InputPath:
    """Marks a config field whose value names a file or directory (relative to the working directory).

    Attributes:
        when: ``always``: the value is always a path. ``exists``: a value that may also be a name
            (a hub id, a timm name, a keyword such as ``wordpiece`` or ``run``): it is taken as a path
            only if it exists on disk relative to the working directory, as Hugging Face does for
            local directories.
        prefixes: the value holds a path only after one of these prefixes (``falcon:runs/demo``);
            a value with none of them is left alone. Empty: the whole value.
        keywords: values that are never paths (``run``, ``pretrained``, ``wordpiece``).
    """

    when: Literal["always", "exists"] = "always"
    prefixes: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()

    def resolve(self, value: Any, base: Path) -> Any:
        """``value`` with its path part made absolute against ``base`` (lists element by element)."""
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            return type(value)(self.resolve(v, base) for v in value)
        text = str(value)
        if text in self.keywords:
            return value
        prefix = ""
        if self.prefixes:
            prefix = next((p for p in self.prefixes if text.startswith(p)), None)
            if prefix is None:
                return value
        path = Path(text[len(prefix) :]).expanduser()
        if path.is_absolute() or not str(path) or (self.when == "exists" and not (base / path).exists()):
            return value
        absolute = Path(os.path.normpath(base / path))  # normpath: no symlinks resolved, '..' folded
        return prefix + str(absolute) if (prefix or isinstance(value, str)) else absolute

    def artifact(self, value: Any) -> Path | None:
        """The file or directory a resolved value names, else None: a hub id, a keyword, a value without one of the
        prefixes, or a relative value (a resolved config holds every path it names absolute)."""
        if value is None or isinstance(value, (list, tuple)):
            return None
        text = str(value)
        if text in self.keywords:
            return None
        prefix = next((p for p in self.prefixes if text.startswith(p)), None) if self.prefixes else ""
        if prefix is None:
            return None
        path = Path(text[len(prefix) :]).expanduser()
        return path if path.is_absolute() else None


def _marker(field) -> InputPath | None:
    return next((m for m in field.metadata if isinstance(m, InputPath)), None)


def section_type(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside an annotation such as ``ShapesConfig | None``, else None: the config section a
    field holds."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = section_type(arg)
            if found is not None:
                return found
    return None


@functools.cache
def _path_fields(model: type[BaseModel]) -> tuple[tuple[str, InputPath | None], ...]:
    """The fields of a config class that are input paths (with their marker) or may hold sections (marker None):
    worked out once per class, since ``falcon recipes validate`` walks every recipe."""
    return tuple(
        (name, _marker(field))
        for name, field in model.model_fields.items()
        if _marker(field) is not None or section_type(field.annotation) is not None
    )


@functools.cache
def input_path_keys(model: type[BaseModel]) -> tuple[tuple[str, InputPath], ...]:
    """``(dotted key, marker)`` of every input-path field of a config class and its sections
    (``pretrain.false_negatives.srcl.aux_embeddings``): what ``falcon compare`` reads as a run's inputs rather than its
    method."""
    found: list[tuple[str, InputPath]] = []
    for name, marker in _path_fields(model):
        if marker is not None:
            found.append((name, marker))
        else:
            section = section_type(model.model_fields[name].annotation)
            found += [(f"{name}.{key}", inner) for key, inner in input_path_keys(section)]
    return tuple(found)


def absolute_input_paths(config: BaseModel, base: str | Path | None = None) -> BaseModel:
    """Make every :class:`InputPath` value of ``config`` (and its sections) absolute against ``base``
    (default: the working directory), in place; returns ``config``."""
    base = Path(os.path.abspath(base if base is not None else os.getcwd()))
    for name, marker in _path_fields(type(config)):
        value = getattr(config, name)
        if marker is not None:
            resolved = marker.resolve(value, base)
            if resolved != value:
                setattr(config, name, resolved)
        elif isinstance(value, BaseModel):
            absolute_input_paths(value, base)
    return config
