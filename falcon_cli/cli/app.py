"""The ``falcon`` command: a Typer app with one module per command group.

Commands only parse, validate and call a stage or a library function; no ML lives here.
Any :class:`~falcon_cli.errors.FalconError` becomes one ``error:`` line and a non-zero
exit; ``--debug`` (or ``FALCON_DEBUG=1``) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from falcon_cli import __version__
from falcon_cli.cli import (
    audit,
    compare,
    data,
    embed,
    evaluate,
    finetune,
    pretrain,
    recipes,
    run,
    search_spaces,
    unimodal,
)
from falcon_cli.errors import FalconError, storage_error
from falcon_cli.runtime.console import make_console

# Help texts are docstrings in Rich markup: Rich reflows a paragraph to the terminal's width, and keeps a line
# break inside one. So each paragraph of a command's docstring is one line, and its first paragraph (the line
# `falcon --help` lists it with) one sentence; a line break only between the lines of a list (the examples).
app = typer.Typer(
    name="falcon",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
app.add_typer(data.app, name="data")
app.add_typer(recipes.app, name="recipes")
app.command(name="run")(run.run_recipe)
app.command(name="pretrain")(pretrain.pretrain)
app.command(name="unimodal")(unimodal.unimodal)
app.command(name="embed")(embed.embed)
app.command(name="build-search-spaces")(search_spaces.build_search_spaces)
app.command(name="audit-false-negatives")(audit.audit_false_negatives)
app.command(name="finetune")(finetune.finetune)
app.command(name="compare")(compare.compare)
app.add_typer(evaluate.app, name="evaluate")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"falcon {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors."),
) -> None:
    """False-negative-aware vision-language pretraining: FALCON and its baselines.

    Examples of typical use:
      falcon run --recipe shapes-demo --run-dir runs/demo
      falcon pretrain --recipe coco-albef
      falcon audit-false-negatives runs/x --judge oracle
      falcon evaluate retrieval runs/x
      falcon compare runs/a-s* runs/b-s*

    The recipes: falcon recipes list. A command's options: falcon COMMAND --help.
    """
    if debug:
        os.environ["FALCON_DEBUG"] = "1"


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turning user errors into one line and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:
        os.environ["FALCON_DEBUG"] = "1"
    try:
        try:
            app(args=argv, prog_name="falcon")
        except Exception as exc:
            # Under torchrun: every other rank learns this rank's error (and stops with its line); a failed collective
            # becomes one line naming the lost rank. A no-op in a single process (lazy: keeps `falcon --help` fast).
            from falcon_cli.runtime.distributed import surface

            problem = surface(exc)
            if problem is not exc:
                raise problem from exc
            raise
    except FalconError as exc:
        if os.environ.get("FALCON_DEBUG") == "1":
            raise
        make_console(stderr=True).print(f"[bold red]{exc.label}:[/] {escape(str(exc))}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        make_console(stderr=True).print("[bold red]interrupted[/]")
        sys.exit(130)
    except Exception as exc:  # a full disk or an unwritable directory outside the atomic writers
        problem = storage_error(exc)
        if problem is None or os.environ.get("FALCON_DEBUG") == "1":
            raise
        make_console(stderr=True).print(f"[bold red]error:[/] {escape(str(problem))}")
        sys.exit(problem.exit_code)


if __name__ == "__main__":
    main()
