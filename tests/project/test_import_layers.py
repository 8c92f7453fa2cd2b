"""The import graph of ``falcon_cli`` and ``stages``: no cycles, and every import points down the layers of
docs/architecture.md.

Every import counts, at module level or inside a function: a cycle hidden in a function-level import still
ties the modules together (a model that reads checkpoints, checkpoints that build models)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("falcon_cli", "stages")

LAYERS: list[tuple[str, ...]] = [  # top to bottom; a module may import only from the layers below its own
    ("falcon_cli.__main__",),
    ("falcon_cli.cli",),  # the command line: parses, validates, hands a config to stages
    ("stages",),  # one module per pipeline stage
    ("falcon_cli.audit",),  # the false-negative audit
    ("falcon_cli.evaluation", "falcon_cli.reporting"),
    ("falcon_cli.methods",),  # falcon's own false-negative methods, one file each, registered by name
    ("falcon_cli.config", "falcon_cli.method_rules"),  # the run's config schema and recipes (knows the models by
    # name); each false-negative method's settings by rule from its paper (docs/methods.md)
    ("falcon_cli.frameworks",),  # what each model family trains and how it is scored
    ("falcon_cli.objectives",),  # losses, rewards, the false-negative methods (MAFA asks a judge)
    ("falcon_cli.judges",),  # who decides whether a pair is a false negative: oracle, ITM, BLIP
    ("falcon_cli.models", "falcon_cli.sampling"),  # networks and their weights; batch composition
    ("falcon_cli.data",),  # datasets, tokenizers, transforms, the shapes world
    ("falcon_cli.runtime",),  # the running process: devices, ranks, run directory, checkpoints
    ("falcon_cli.artifacts",),  # files: atomic writers, schemas, readers, checkpoint layout
    ("falcon_cli.registry",),  # false-negative methods and composers by name; the plugins that add them
    (
        "falcon_cli.errors",
        "falcon_cli.method_weights",
        "falcon_cli.lazy_exports",
        "falcon_cli.field_docs",
        "falcon_cli",
    ),  # error types; the
    # papers' loss weights; a package's public names imported on first use; the version
]
"""Layers of one line are siblings: neither imports the other."""


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """``module -> the falcon_cli modules it imports`` (``from a.b import c`` is ``a.b.c`` when that is a module)."""
    modules = {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package upwards
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:  # `import falcon_cli.a.b` names a.b; attributes fall back
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    # models.weights imports the state-dict files module at top level and the hub helpers in a function
    assert "falcon_cli.artifacts.state_dicts" in graph["falcon_cli.models.weights"]
    assert "falcon_cli.runtime.hub" in graph["falcon_cli.models.weights"]  # a function-level import


def layer_of(module: str) -> tuple[int, str]:
    """``(layer index, entry)``: the longest entry of :data:`LAYERS` that is ``module`` or a package above it."""
    found = [
        (len(entry), index, entry)
        for index, entries in enumerate(LAYERS)
        for entry in entries
        if module == entry or module.startswith(entry + ".")
    ]
    if not found:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)")
    _, index, entry = max(found)
    return index, entry


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import of ``graph`` into its own layer's siblings or a layer above."""
    wrong = []
    for module, imported in sorted(graph.items()):
        layer, entry = layer_of(module)
        assert entry != "falcon_cli" or module == "falcon_cli", f"{module}: a new package needs its place in LAYERS"
        for target in sorted(imported):
            target_layer, target_entry = layer_of(target)
            if target_entry != entry and target_layer <= layer:
                wrong.append(f"{module} imports {target} ({'a sibling' if target_layer == layer else 'a layer above'})")
    return wrong


def test_every_import_points_down_the_layers():
    wrong = layer_violations(import_graph())
    assert not wrong, "imports against the layers of docs/architecture.md:\n" + "\n".join(wrong)


def test_the_layer_check_sees_an_upward_import():
    models = next(i for i, layer in enumerate(LAYERS) if "falcon_cli.models" in layer)
    assert layer_of("falcon_cli.models.albef") == (models, "falcon_cli.models")
    assert layer_of("falcon_cli.models") == (models, "falcon_cli.models")
    assert layer_of("falcon_cli") == (len(LAYERS) - 1, "falcon_cli") and layer_of("stages.pretrain") == (2, "stages")
    assert layer_of("falcon_cli.artifacts.atomic")[0] > layer_of("falcon_cli.runtime.checkpoint")[0]
    assert layer_violations(
        {
            "falcon_cli.runtime.checkpoint": {"falcon_cli.artifacts.atomic", "falcon_cli.runtime.hub"},
            "falcon_cli.models.weights": {"falcon_cli.sampling.cache", "falcon_cli.objectives.common"},
        }
    ) == [
        "falcon_cli.models.weights imports falcon_cli.objectives.common (a layer above)",
        "falcon_cli.models.weights imports falcon_cli.sampling.cache (a sibling)",
    ]


def test_no_module_imports_itself_back():
    found = cycles(import_graph())
    assert not found, "import cycles (break each by moving what both sides need below them):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def lazy_imports_without_reason() -> list[str]:
    """Function-level imports of falcon_cli or stages modules that do not say why they are lazy: a ``(lazy: ...)``
    comment on the import, or on the comment line right above its block of imports."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for function in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(function):
                    if not (isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES):
                        continue
                    above = node.lineno - 2
                    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                        above -= 1
                    said = "lazy" in lines[node.lineno - 1] or (
                        above >= 0 and lines[above].strip().startswith("#") and "lazy" in lines[above]
                    )
                    if not said:
                        found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {node.module} inside a function")
    return found


def test_function_level_imports_say_what_they_buy():
    """A function-level import only where it keeps a fast path fast (`falcon --help`, reading a config), saying so:
    hoisted, any other import costs nothing, since the graph above has no cycle with or without it."""
    found = lazy_imports_without_reason()
    assert not found, "move these to the module's imports, or say why they are lazy:\n" + "\n".join(found)
