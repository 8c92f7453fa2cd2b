"""How far the whole pretrain config reaches: the modules that read it, counted from the source.

    PYTHONPATH=. .venv/bin/python benchmarks/config_reach.py            # the table
    PYTHONPATH=. .venv/bin/python benchmarks/config_reach.py --list     # and each module's reads

A module *reads the whole pretrain config* when it reaches into ``PretrainConfig`` through the section object
itself: ``config.pretrain.<field>``, or ``<name>.<field>`` (also ``self.<name>.<field>``) where ``<name>`` is bound
to ``config.pretrain`` (``p = config.pretrain``) or is a parameter called ``p`` or annotated ``PretrainConfig``. A
module that is handed a narrower object (a typed sub-section, or the values it needs) does not count. Issue 69 asks
that fewer modules do this after the config is split into typed sections: this script gives the number before and
after, from the same rule. It reads the code as text, so a section passed under another name is missed: the count
is a floor.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

from falcon_cli.config.schema import PretrainConfig

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("falcon_cli", "stages")
FIELDS = frozenset(PretrainConfig.model_fields)


def _pretrain_names(tree: ast.AST) -> set[str]:
    """Names bound to the pretrain section in a module: ``p = config.pretrain`` (any ``X.pretrain``), parameters called
    ``p``, and parameters annotated ``PretrainConfig``."""
    names = {"p"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "pretrain":
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.arg) and node.annotation is not None:
            if "PretrainConfig" in ast.unparse(node.annotation):
                names.add(node.arg)
    return names


def reads(path: Path) -> Counter:
    """``{field: how often}`` of the pretrain fields a module reads through the whole section."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names, found = _pretrain_names(tree), Counter()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in FIELDS:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in names:
            found[node.attr] += 1
        elif isinstance(owner, ast.Attribute) and (owner.attr == "pretrain" or owner.attr in names):
            found[node.attr] += 1  # (``config.pretrain.x``, and ``self.p.x`` where an object keeps the section)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="each module's fields, most read first")
    args = parser.parse_args()
    modules = {
        str(path.relative_to(ROOT)): reads(path)
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    reaching = {name: found for name, found in modules.items() if found}
    fields = Counter()
    for found in reaching.values():
        fields.update(found.keys())
    print(f"{len(reaching)} of {len(modules)} modules read the whole pretrain config ({len(FIELDS)} fields); ")
    print(f"{len(fields)} distinct fields are read that way; the most shared: ")
    print(", ".join(f"{field} ({count} modules)" for field, count in fields.most_common(8)))
    if args.list:
        for name, found in sorted(reaching.items(), key=lambda item: -sum(item[1].values())):
            print(f"{sum(found.values()):4d}  {name}: {', '.join(f for f, _ in found.most_common(6))}")


if __name__ == "__main__":
    main()
