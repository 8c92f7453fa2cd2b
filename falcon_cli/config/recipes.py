"""Recipes: find them by name or path, apply ``key=value`` overrides, validate to a :class:`Recipe`.

Every problem becomes one :class:`FalconError` line: an unknown recipe lists the valid
names, an unknown key names the nearest valid key, a wrong type names the expected type
and the value given.
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from falcon_cli.artifacts.config_diff import with_missing_keys
from falcon_cli.artifacts.renamed_keys import upgrade_mapping, upgrade_override, upgrade_stored
from falcon_cli.config.paths import absolute_input_paths, section_type
from falcon_cli.errors import FalconError

if TYPE_CHECKING:
    from falcon_cli.config.schema import Recipe

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it: ``recipes list`` and ``recipes validate`` read every
recipe and its ``base:`` chain, 7x faster than with the pure-Python loader (the same mappings)."""

RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipes"
"""The recipes shipped with falcon (``recipes/`` at the repository root)."""

STUDY_DIR = "studies"
"""The subfolder of a recipe directory for study and diagnostic variants (ablations, rewards under test): still
found by name, listed apart from the recipes a user starts from."""

RECIPE_GROUPS = (
    ("Start here", ("shapes-demo",)),
    ("COCO, ALBEF: FALCON and every baseline (the FALCON paper's Table 1)", ("coco-albef",)),
    ("COCO, BLIP-2 stage 1 (Table 3)", ("coco-blip2",)),
    ("COCO, dual encoders (open_clip)", ("coco-clip", "coco-siglip", "coco-coca")),
    ("Shapes world on CPU, BLIP-2 and dual encoders", ("shapes-blip2", "shapes-siglip")),
    ("Shapes world on CPU, albef-tiny: FALCON and every baseline", ("shapes-",)),
)
"""How ``falcon recipes list`` groups the shipped recipes a user starts from: the first group with a name prefix
that the recipe's name starts with (so the more specific prefixes come first)."""


def recipe_dirs() -> list[Path]:
    """Directories searched for recipes by name: ``$FALCON_RECIPE_PATH`` (os.pathsep-separated), then the shipped
    ones."""
    extra = [Path(p) for p in os.environ.get("FALCON_RECIPE_PATH", "").split(os.pathsep) if p]
    return [*extra, RECIPE_DIR]


def recipe_folders() -> list[Path]:
    """The folders a recipe is looked up in by name, in order: each of :func:`recipe_dirs`, then its studies."""
    return [folder for directory in recipe_dirs() for folder in (directory, directory / STUDY_DIR)]


def list_recipes() -> dict[str, Path]:
    """All recipes found by name, ``{name: path}``, sorted by name (earlier directories win; within one, a
    recipe beside the others wins over a study of the same name)."""
    found: dict[str, Path] = {}
    for folder in recipe_folders():
        for path in sorted(folder.glob("*.yaml"), key=lambda p: p.name):
            found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def recipe_group(name: str, path: Path) -> str:
    """The heading ``falcon recipes list`` shows a recipe under: studies apart, recipes from
    ``$FALCON_RECIPE_PATH`` apart, the shipped ones by :data:`RECIPE_GROUPS`."""
    if path.parent.name == STUDY_DIR:
        return f"Studies and diagnostics (recipes/{STUDY_DIR}/: ablations, rewards under test)"
    if path.parent.resolve() != RECIPE_DIR.resolve():
        return f"Your recipes ({path.parent})"
    return next((title for title, prefixes in RECIPE_GROUPS if name.startswith(prefixes)), "Other")


def _moved_hint(path: Path) -> str:
    """For a recipe path that does not exist: where a recipe of that name is now, if it moved (e.g. a study
    moved into ``recipes/studies/``), as the end of the error line."""
    found = list_recipes().get(path.stem)
    return f": it moved to {found} (`--recipe {path.stem}` finds it by name)" if found is not None else ""


def find_recipe(name_or_path: str | Path) -> Path:
    """Resolve a recipe name (file stem) or a path to a YAML file."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.suffix in {".yaml", ".yml"} or os.sep in text:
        if path.is_file():
            return path
        raise FalconError(f"recipe file {path} not found{_moved_hint(path)}")
    for folder in recipe_folders():  # (the file itself first: listing every folder per `base:` was the slow part)
        if (path := folder / f"{text}.yaml").is_file():
            return path
    recipes = list_recipes()
    near = difflib.get_close_matches(text, recipes, n=1)
    hint = f"did you mean '{near[0]}'? " if near else ""
    raise FalconError(f"unknown recipe '{text}': {hint}`falcon recipes list` shows them all")


_YAML_CACHE: dict[tuple[str, int, int], dict[str, Any]] = {}
"""Mappings already parsed in this process, by (file, modification time, size)."""


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, turning syntax errors into one line with file, line and column. A file read before
    and unchanged since (same size and modification time) is not parsed again: ``falcon recipes validate`` reads
    each ``base:`` recipe once, not once per recipe that extends it. The caller gets its own copy."""
    try:
        stat = path.stat()
    except OSError:
        stat = None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size) if stat is not None else None
    if key is not None and key in _YAML_CACHE:
        return copy.deepcopy(_YAML_CACHE[key])
    raw = _parse_yaml(path)
    if key is not None:
        _YAML_CACHE[key] = copy.deepcopy(raw)
    return raw


def _parse_yaml(path: Path) -> dict[str, Any]:
    """:func:`read_yaml`'s parse, uncached."""
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        raise FalconError(f"{path}:{where} invalid YAML ({getattr(exc, 'problem', None) or exc})") from None
    except OSError as exc:
        raise FalconError(f"{path}: cannot read ({exc.strerror})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise FalconError(f"{path}: a recipe must be a mapping of sections, got a {type(raw).__name__}")
    return raw


# ---------------------------------------------------------------------------------------------
# Walking the schema: valid keys, nested sections, nearest-key suggestions.


def recipe_schema() -> type[Recipe]:
    """The schema a recipe validates against (:class:`~falcon_cli.config.schema.Recipe`), the ``model`` of the
    functions below when they are given none."""
    # (lazy: pydantic builds the schema's ~30 models in a fifth of a second; `falcon recipes list` needs none)
    from falcon_cli.config.schema import Recipe

    return Recipe


def valid_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Every dotted key the schema accepts (sections and leaves), e.g. ``data.shapes.images``."""
    model = model or recipe_schema()
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        keys.append(key)
        sub = section_type(field.annotation)
        if sub is not None:
            keys.extend(valid_keys(sub, key + "."))
    return keys


def _unknown_key_error(key: str, source: str, model: type[BaseModel], prefix: str = "") -> FalconError:
    """The error for an unknown dotted ``key``; ``model`` is the section at ``prefix``."""
    candidates = [prefix + k for k in valid_keys(model)]
    near = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return FalconError(f"{source}: unknown key '{key}'{hint} (`falcon recipes show NAME` lists the keys)")


def check_keys(raw: dict[str, Any], source: str, model: type[BaseModel] | None = None, prefix: str = "") -> None:
    """Reject any key the schema does not know, naming the nearest valid key."""
    model = model or recipe_schema()
    for name, value in raw.items():
        key = f"{prefix}{name}"
        if name not in model.model_fields:
            raise _unknown_key_error(key, source, model, prefix)
        sub = section_type(model.model_fields[name].annotation)
        if sub is not None and isinstance(value, dict):
            check_keys(value, source, sub, key + ".")


# ---------------------------------------------------------------------------------------------
# Overrides.


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``key=value``; the value is parsed as a YAML scalar/list (``3``, ``true``, ``[a, b]``, ``null``)."""
    if "=" not in text:
        raise FalconError(f"override '{text}' is not of the form key=value (e.g. data.shapes.images=500)")
    key, _, value = text.partition("=")
    key = key.strip()
    if not key:
        raise FalconError(f"override '{text}' has an empty key")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value  # not YAML: keep the literal string; the schema decides whether it fits
    return key, parsed


def apply_overrides(
    raw: dict[str, Any], overrides: list[str], model: type[BaseModel] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Set each ``key=value`` into a copy of ``raw`` (keys checked against ``model``, default :func:`recipe_schema`).

    Returns the new mapping and ``{key: override text}`` so errors can point at the override.
    """
    model = model or recipe_schema()

    result = copy.deepcopy(raw)
    given: dict[str, str] = {}
    for text in overrides:
        key, value = parse_override(text)
        key = upgrade_override(key, value, f"override '{text}'")  # (a key renamed in 0.3.0: its new name)
        if key not in valid_keys(model):
            raise _unknown_key_error(key, f"override '{text}'", model)
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
        given[key] = text
    return result, given


# ---------------------------------------------------------------------------------------------
# Validation.

_EXPECTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping of keys",
    "path_type": "a path",
}


def _describe(err: dict[str, Any]) -> str:
    expected = _EXPECTED.get(err["type"])
    if err["type"] == "literal_error":
        expected = "one of " + err.get("ctx", {}).get("expected", "").replace("'", "")
    if expected:
        return f"expected {expected}, got {err.get('input')!r}"
    message = err["msg"].removeprefix("Value error, ")  # (a validator's own line, as it wrote it)
    return message[0].lower() + message[1:]


def _error_key(err: dict[str, Any]) -> str:
    parts = []
    for part in err["loc"]:
        if isinstance(part, int):
            parts[-1] = f"{parts[-1]}[{part}]" if parts else f"[{part}]"
        elif part in {"function-after", "function-before"} or "[" in str(part):
            continue  # pydantic union/validator markers, not user keys
        else:
            parts.append(str(part))
    return ".".join(parts)


def as_current_config(stored: dict[str, Any]) -> dict[str, Any]:
    """A run's recorded config with the fields the schema gained since it was written filled with their defaults
    (the defaults of new fields keep the behaviour runs had before them), every recorded value as it was; the
    recorded config unchanged where today's schema no longer accepts it (its differences are then reported)."""
    stored = upgrade_stored(stored, "a run's config")
    try:
        current = recipe_schema().model_validate(stored).model_dump(mode="json")
    except (ValueError, TypeError):  # (pydantic's ValidationError is a ValueError)
        return stored
    return with_missing_keys(stored, current)


def validate_config(
    raw: dict[str, Any], source: str, overridden: dict[str, str] | None = None, model: type[BaseModel] | None = None
) -> Any:
    """Validate a raw mapping into ``model`` (default :func:`recipe_schema`); errors name the key (or the override)
    and the problem."""
    model = model or recipe_schema()
    check_keys(raw, source, model)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _error_key(err)
        named = [name for name in (overridden or {}) if key == name or key.startswith(f"{name}[")]  # (a list's item)
        where = f"override '{overridden[named[0]]}'" if named else source
        inside = [text for name, text in (overridden or {}).items() if key and name.startswith(f"{key}.")]
        if where == source and inside:  # a rule across fields of a section: the overrides that touched it
            where = f"{source} with " + ", ".join(f"'{text}'" for text in inside)
        label = f"key '{key}'" if key else "recipe"
        raise FalconError(f"{where}: {label}: {_describe(err)}") from None


def read_recipe(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe file's mapping; with ``base: <recipe>`` it is that recipe's mapping with this
    file's keys merged over it, section by section (sibling recipes state only what differs)."""
    try:
        raw = upgrade_mapping(read_yaml(path), str(path))  # (keys renamed in 0.3.0: their new names, one line each)
    except ValueError as exc:
        raise FalconError(f"{path}: {exc}") from None
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str):
        raise FalconError(f"{path}: key 'base': expected a recipe name or path, got {base!r}")
    base_path = find_recipe(base)
    if base_path.resolve() in _seen or base_path.resolve() == path.resolve():
        raise FalconError(f"{path}: key 'base': recipes extend each other in a cycle ({base})")
    merged = read_recipe(base_path, (*_seen, path.resolve()))
    merged.pop("name", None)
    return _merge(merged, raw)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``: nested mappings key by key, other values replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_recipe(name_or_path: str | Path, overrides: list[str] | None = None) -> tuple[Recipe, Path]:
    """Find, read (following ``base:``), override and validate a recipe. Returns the recipe and its file.

    Input paths (the dataset, weights, embeddings, checkpoints: see :mod:`falcon_cli.config.paths`)
    are relative to the working directory as given and absolute in the returned recipe, so a run
    records exactly which files it used and is readable from any working directory.
    """
    path = find_recipe(name_or_path)
    raw = read_recipe(path)
    raw.setdefault("name", path.stem)
    raw, overridden = apply_overrides(raw, list(overrides or []))
    return absolute_input_paths(validate_config(raw, str(path), overridden)), path


RUN_WORLD = "world"
"""Where a recipe's generated shapes world goes when it names no ``data.dataset``: ``<run>/world``."""


def place_dataset(config: Recipe, run_dir: str | Path) -> Recipe:
    """``config`` with ``data.dataset`` set to ``<run_dir>/world`` (absolute) when it names none (a generated
    shapes world then lives in its run); in place, and returned."""
    if config.data.dataset is None:
        config.data.dataset = Path(os.path.abspath(Path(run_dir) / RUN_WORLD))
    return config


def recipe_header(path: Path) -> str:
    """The comment block at the top of a recipe (its documentation and exact command)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines).strip()


def resolved_yaml(recipe: Recipe) -> str:
    """The resolved config as YAML, the way it is written into a run directory."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
