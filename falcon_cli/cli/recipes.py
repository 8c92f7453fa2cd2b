"""``falcon recipes list|show|validate|upgrade``: the shipped recipes, their keys, and a recipe's keys renamed."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from falcon_cli.errors import FalconError
from falcon_cli.runtime.console import make_console

app = typer.Typer(
    help="List, show, validate and upgrade recipes.\n\nExample: falcon recipes show shapes-demo", no_args_is_help=True
)
console = make_console()


@app.command("list")
def list_() -> None:
    """List the recipes, grouped by what they are for.

    The demo, COCO per framework and method, the shapes world per method, then the studies (recipes/studies/) and your own ($FALCON_RECIPE_PATH).

    Example: falcon recipes list
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    from falcon_cli.config.recipes import RECIPE_GROUPS, list_recipes, read_recipe, recipe_group  # (lazy: fast --help)

    groups: dict[str, list[tuple[str, str]]] = {}
    for name, path in list_recipes().items():
        groups.setdefault(recipe_group(name, path), []).append((name, str(read_recipe(path).get("description", ""))))
    order = [title for title, _ in RECIPE_GROUPS]
    width = max((len(name) for rows in groups.values() for name, _ in rows), default=0)
    for title in sorted(groups, key=lambda t: order.index(t) if t in order else len(order)):
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 2))
        table.add_column(no_wrap=True, style="cyan", min_width=width)
        table.add_column(overflow="ellipsis", no_wrap=True)
        for name, description in groups[title]:
            table.add_row(Text(name), Text(description))
        console.print(f"[bold]{escape(title)}[/]")
        console.print(table)
    console.print("[dim]falcon recipes show NAME: every resolved key · falcon run --recipe NAME: run it[/]")


@app.command("show")
def show(
    recipe: str = typer.Argument(..., help="Recipe name (file stem) or path to a YAML file."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides to apply before showing."),
) -> None:
    """Print a recipe's header and its fully resolved config (every key, defaults filled in).

    Example: falcon recipes show shapes-demo data.shapes.images=500
    """
    from falcon_cli.config.recipes import load_recipe, recipe_header, resolved_yaml  # (lazy: the schema; a fast --help)

    config, path = load_recipe(recipe, overrides or [])
    header = recipe_header(path)
    if header:
        console.print(Text(header + "\n", style="dim"))
    console.print(f"# {path}", markup=False)
    console.print(resolved_yaml(config), markup=False)


@app.command("validate")
def validate(
    recipes: Optional[List[str]] = typer.Argument(None, help="Recipe names or paths (default: every shipped recipe)."),
) -> None:
    """Validate recipes against the config schema; exit 2 if any is invalid.

    Without names, every recipe found by name.

    Example: falcon recipes validate
    Example: falcon recipes validate my.yaml
    """
    from falcon_cli.config.recipes import find_recipe, list_recipes, load_recipe  # (lazy: the schema; a fast --help)

    names = recipes or list(list_recipes())
    failures = 0
    for name in names:
        try:
            path = find_recipe(name)
            load_recipe(path)
        except FalconError as exc:
            console.print(f"[red]✗[/] {escape(f'{name}: {exc}')}")
            failures += 1
        else:
            console.print(f"[green]✓[/] {escape(f'{name} ({path})')}")
    if failures:
        raise FalconError(f"{failures} of {len(names)} recipes are invalid")


@app.command("upgrade")
def upgrade(
    files: List[Path] = typer.Argument(..., help="Recipe files to rewrite in place."),
    check: bool = typer.Option(False, "--check", help="Only say which keys would move; exit 1 if any would."),
) -> None:
    """Rewrite recipe files' keys renamed in 0.3.0 to their new names, keeping comments and order.

    pretrain.scheduler.lr becomes pretrain.scheduler.lr, pretrain.composer.name: falcon becomes pretrain.composer.name: falcon, and so on (CHANGELOG 0.3.0 lists them). The file is checked to read as the same settings before it is replaced, atomically. Old keys still work in 0.3.0, with one deprecation line each.

    Example: falcon recipes upgrade my-recipe.yaml
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    from falcon_cli.config.upgrade import upgrade_file  # (lazy: a fast --help)

    moved_any = False
    for path in files:
        if not path.is_file():
            raise FalconError(f"recipe file {path} not found")
        moves = upgrade_file(path, check=check)
        moved_any = moved_any or bool(moves)
        verb = "would move" if check else "moved"
        if moves:
            shown = ", ".join(f"{old} -> {new}" for old, new in moves[:3]) + (
                f", and {len(moves) - 3} more" if len(moves) > 3 else ""
            )
            console.print(f"{escape(str(path))}: {verb} {len(moves)} key(s): {escape(shown)}")
        else:
            console.print(f"{escape(str(path))}: already uses the 0.3.0 keys")
    if check and moved_any:
        raise typer.Exit(1)
