"""``falcon recipes list|show|validate``: the shipped recipes and their keys."""

from __future__ import annotations

from typing import List, Optional

import typer
from falcon_cli.runtime.console import make_console
from rich.table import Table

from falcon_cli.config.recipes import find_recipe, list_recipes, load_recipe, read_recipe, recipe_header, resolved_yaml
from falcon_cli.errors import FalconError

app = typer.Typer(help="List, show and validate recipes.\n\nExample: falcon recipes show shapes-demo", no_args_is_help=True)
console = make_console()


@app.command("list")
def list_() -> None:
    """List the recipes found by name (shipped ones and $FALCON_RECIPE_PATH).

    Example: falcon recipes list
    """
    table = Table("recipe", "stages", "description", box=None, header_style="bold")
    for name, path in list_recipes().items():
        raw = read_recipe(path)
        table.add_row(name, " → ".join(raw.get("stages", [])), str(raw.get("description", "")))
    console.print(table)


@app.command("show")
def show(
    recipe: str = typer.Argument(..., help="Recipe name (file stem) or path to a YAML file."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides to apply before showing."),
) -> None:
    """Print a recipe's header and its fully resolved config (every key, defaults filled in).

    Example: falcon recipes show shapes-demo data.shapes.images=500
    """
    config, path = load_recipe(recipe, overrides or [])
    header = recipe_header(path)
    if header:
        console.print(f"[dim]{header}[/]\n")
    console.print(f"# {path}")
    console.print(resolved_yaml(config), markup=False)


@app.command("validate")
def validate(
    recipes: Optional[List[str]] = typer.Argument(None, help="Recipe names or paths (default: every shipped recipe)."),
) -> None:
    """Validate recipes against the config schema; exit 2 on the first invalid one.

    Example: falcon recipes validate            # all shipped recipes
             falcon recipes validate my.yaml
    """
    names = recipes or list(list_recipes())
    failures = 0
    for name in names:
        try:
            path = find_recipe(name)
            load_recipe(path)
        except FalconError as exc:
            console.print(f"[red]✗[/] {name}: {exc}")
            failures += 1
        else:
            console.print(f"[green]✓[/] {name} ({path})")
    if failures:
        raise FalconError(f"{failures} of {len(names)} recipes are invalid")
