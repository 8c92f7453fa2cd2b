"""The real `falcon` command, driven end to end in fresh processes on tiny shapes worlds."""

from __future__ import annotations

import json

import pytest
import yaml

from falcon_cli import __version__

COMMANDS = [
    [],
    ["data"],
    ["data", "shapes"],
    ["data", "check"],
    ["recipes"],
    ["recipes", "list"],
    ["recipes", "show"],
    ["recipes", "validate"],
    ["run"],
    ["pretrain"],
    ["unimodal"],
    ["embed"],
    ["build-search-spaces"],
    ["audit-false-negatives"],
]


def test_version(cli):
    proc = cli("--version", check=True)
    assert proc.stdout.strip() == f"falcon {__version__}"


@pytest.fixture(scope="module")
def falcon_command():
    """The `falcon` command itself, invoked in this process (its help needs no fresh one: ~2.5 s each saved)."""
    import typer

    from falcon_cli.cli.app import app

    return typer.main.get_command(app)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "falcon")
def test_every_help_shows_a_real_example(falcon_command, command):
    from click.testing import CliRunner

    proc = CliRunner().invoke(falcon_command, [*command, "--help"], prog_name="falcon")
    assert proc.exit_code == 0, proc.output
    assert "Example" in proc.output and "falcon " in proc.output.split("Example", 1)[1]


def test_every_help_reflows_in_80_columns(falcon_command):
    """Rich wraps a help paragraph to the terminal but keeps a line break inside it (a line broken in the source
    shows as a ragged one): each paragraph is one line, or a list of example lines that fit in 80 columns."""
    import inspect

    def walk(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    ragged, long = [], []
    for path, command in walk(falcon_command, ["falcon"]):
        for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
            lines = paragraph.splitlines()
            listed = [line for line in lines if line.startswith(("Example", "  "))]
            if len(lines) > 1 and listed != lines[1:] and listed != lines:
                ragged.append(f"{' '.join(path)}: {lines[0][:50]}...")
            long += [f"{' '.join(path)}: {line}" for line in listed if len(line) > 78]  # (80 less Rich's margins)
    assert not ragged, "help paragraphs broken mid-sentence:\n" + "\n".join(ragged)
    assert not long, "example lines that wrap in 80 columns:\n" + "\n".join(long)


def test_only_working_commands_are_registered():
    import typer

    from falcon_cli.cli.app import app

    # ML commands (embed, evaluate, ...) arrive with the stages that implement them: no placeholders.
    assert set(typer.main.get_command(app).commands) == {
        "data",
        "recipes",
        "run",
        "pretrain",
        "unimodal",
        "embed",
        "build-search-spaces",
        "audit-false-negatives",
        "finetune",
        "evaluate",
        "compare",
    }
    evaluate = typer.main.get_command(app).commands["evaluate"]
    assert set(evaluate.commands) == {"retrieval", "vqa", "nlvr2"}


def test_shapes_then_check_reports_no_problems(cli, tmp_path):
    world = tmp_path / "w"
    made = cli("data", "shapes", "--out", world, "--images", 300, "--seed", 1)
    assert made.returncode == 0, made.stderr
    assert "test" in made.stdout and (world / "dataset.yaml").exists()
    report = tmp_path / "report.json"
    checked = cli("data", "check", world, "--json", report)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no problems" in checked.stdout
    data = json.loads(report.read_text())
    assert data["ok"] and data["problems"] == []
    assert {s["label"].split("/")[0] for s in data["sources"]} == {"pretrain", "retrieval", "vqa", "nlvr2"}
    pretrain = next(s for s in data["sources"] if s["label"].startswith("pretrain"))
    assert pretrain["entries"] == 5 * 240 and pretrain["images_missing"] == 0


def test_shapes_knobs_as_overrides_and_their_errors(cli, tmp_path):
    ok = cli("data", "shapes", "--out", tmp_path / "w", "--images", 40, "max_objects=2", "num_colors=8")
    assert ok.returncode == 0, ok.stderr
    config = json.loads((tmp_path / "w" / "world.json").read_text())["config"]
    assert config["max_objects"] == 2 and config["num_colors"] == 8
    bad = cli("data", "shapes", "--out", tmp_path / "x", "--images", 40, "max_objectz=2")
    assert bad.returncode == 2
    assert "unknown key 'max_objectz'; did you mean 'max_objects'?" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_broken_file_gives_one_line_error(cli, tmp_path):
    world = tmp_path / "w"
    cli("data", "shapes", "--out", world, "--images", 40, check=True)
    text = (world / "pretrain.json").read_text()
    (world / "pretrain.json").write_text(text[:200])  # truncated mid-entry
    proc = cli("data", "check", world)
    assert proc.returncode == 1
    assert "pretrain.json: line" in proc.stdout and "column" in proc.stdout
    error = proc.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error:") and "pretrain.json" in error[0]


def test_missing_images_fail_by_default_and_skip_on_request(cli, tmp_path):
    world = tmp_path / "w"
    cli("data", "shapes", "--out", world, "--images", 40, check=True)
    first = json.loads((world / "pretrain.json").read_text())[0]["image"]
    (world / first).unlink()
    failed = cli("data", "check", world)
    assert failed.returncode == 1 and "missing" in failed.stderr and first.split("/")[-1] in failed.stderr
    skipped = cli("data", "check", world, "--on-missing", "skip")
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr


def test_user_errors_are_one_line_without_traceback(cli, tmp_path):
    cases = [
        (["run", "--recipe", "shapes-dmo"], "unknown recipe 'shapes-dmo': did you mean 'shapes-demo'?"),
        (
            ["run", "--recipe", "shapes-demo", "--run-dir", tmp_path / "r", "data.shape.images=5"],
            "did you mean 'data.shapes.images'?",
        ),
        (
            ["run", "--recipe", "shapes-demo", "--run-dir", tmp_path / "r", "data.shapes.images=lots"],
            "expected an integer, got 'lots'",
        ),
        (["data", "check", tmp_path / "nowhere"], "dataset spec not found"),
    ]
    for args, expected in cases:
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, proc.stderr)
    assert not (tmp_path / "r").exists(), "nothing is written when the config is invalid"
    debug = cli("--debug", "run", "--recipe", "shapes-dmo")
    assert "Traceback" in debug.stderr and "FalconError" in debug.stderr


def test_recipes_list_show_validate(cli, tmp_path):
    listed = cli("recipes", "list", check=True).stdout
    assert "shapes-demo" in listed
    shown = cli("recipes", "show", "shapes-demo", "data.shapes.images=123", check=True).stdout
    assert "falcon run --recipe shapes-demo" in shown and "images: 123" in shown
    assert cli("recipes", "validate", check=True).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  dataset: x\n  tokenizr: wordpiece\n")
    proc = cli("recipes", "validate", bad)
    assert proc.returncode == 2 and "did you mean 'data.tokenizer'" in proc.stdout


def test_recipe_headers_descriptions_and_errors_print_square_brackets_as_written(cli, tmp_path, monkeypatch):
    """Rich would read ``[eccv]`` as a style and drop it: a header, a description and an error line print literally."""
    mine = tmp_path / "recipes"
    mine.mkdir()
    (mine / "my-brackets.yaml").write_text(
        "# Needs the extra: pip install 'falcon-vlp[eccv]'\n# falcon run --recipe my-brackets stages=[data]\n"
        "base: shapes-demo\ndescription: shapes with [bold]brackets[/] kept\n"
    )
    monkeypatch.setenv("FALCON_RECIPE_PATH", str(mine))
    shown = cli("recipes", "show", "my-brackets", check=True).stdout
    assert "pip install 'falcon-vlp[eccv]'" in shown and "stages=[data]" in shown, shown
    listed = cli("recipes", "list", check=True).stdout
    assert "shapes with [bold]brackets[/] kept" in listed, listed
    proc = cli("recipes", "show", "no-such[eccv]")
    assert proc.returncode == 2 and "unknown recipe 'no-such[eccv]'" in proc.stderr, proc.stderr


def test_run_recipe_end_to_end(cli, tmp_path):
    run_dir, world = tmp_path / "run", tmp_path / "world"
    args = [
        "run",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        run_dir,
        f"data.dataset={world}",
        "stages=[data]",
        "data.shapes.images=60",
        "data.tokenizer_vocab_size=200",
    ]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["config"]["data"]["shapes"]["images"] == 60
    assert manifest["command"][:3] == ["falcon", "run", "--recipe"]
    stage = manifest["stages"]["data"]
    assert stage["status"] == "completed" and stage["result"]["pretrain_pairs"] == 5 * 48
    assert stage["result"]["load"]["dropped"] == 0
    assert {"data/check.json", "data/tokenizer"} <= set(manifest["artifacts"])
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["shapes"]["images"] == 60
    from transformers import BertTokenizerFast

    tokenizer = BertTokenizerFast.from_pretrained(str(run_dir / "data" / "tokenizer"))
    assert tokenizer.convert_ids_to_tokens(tokenizer("a red circle")["input_ids"])[0] == "[CLS]"
    # Same config again: the world is reused and the run continues; another config is refused.
    again = cli(*args)
    assert again.returncode == 0, again.stderr
    assert len(json.loads((run_dir / "manifest.json").read_text())["history"]) == 2
    other = cli(*args[:-1], "data.tokenizer_vocab_size=300")
    assert other.returncode == 2 and "different config (data.tokenizer_vocab_size: 200 -> 300)" in other.stderr
    # A run recorded before a field existed (here pretrain.false_negatives.oracle) continues: the field's default is
    # what the run did. A recorded value that differs from today's still counts.
    recorded = json.loads((run_dir / "manifest.json").read_text())
    del recorded["config"]["pretrain"]["false_negatives"]["oracle"]
    (run_dir / "manifest.json").write_text(json.dumps(recorded))
    older = cli(*args)
    assert older.returncode == 0, older.stderr
    assert (
        json.loads((run_dir / "manifest.json").read_text())["config"]["pretrain"]["false_negatives"]["oracle"] == "keep"
    )
    recorded = json.loads((run_dir / "manifest.json").read_text())
    recorded["config"]["pretrain"]["false_negatives"]["oracle"] = "mask"
    (run_dir / "manifest.json").write_text(json.dumps(recorded))
    changed = cli(*args)
    assert changed.returncode == 2 and "pretrain.false_negatives.oracle: 'mask' -> 'keep'" in changed.stderr
