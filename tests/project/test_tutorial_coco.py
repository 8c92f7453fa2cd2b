"""docs/tutorial-coco.md, run as written on a tiny COCO in ALBEF's layout.

The tutorial's bash blocks are taken from the Markdown itself. Each block follows a comment
``<!-- tutorial-test: KIND -->`` saying how the test treats it:

- ``variables``: the shell variables the other blocks use; the test sets ``COCO`` to its own tiny dataset and keeps
  the documented values of the rest (``SMOKE``, ``RUNS``: relative run directories);
- ``run``: run in full, in order, in one bash session, as a user pastes them (the smoke section: plain ``falcon``);
- ``resolve``: the 8-GPU section, run by bash as written, but ``torchrun ... -m falcon_cli ARGS`` and ``falcon ARGS``
  are only checked: the command line is parsed by falcon's own CLI (options, types) and every recipe with its
  overrides is resolved and validated against the shipped recipes, as ``falcon recipes show`` does; nothing trains;
- ``skip``: the downloads.

``falcon`` and ``torchrun`` are small shims on PATH that hand each command line to this test process, which runs it
through the pre-imported CLI zygote of tests/conftest.py (each command in its own process, seconds faster than a
fresh interpreter). The tutorial's recipes are the shipped ones; the test shrinks them for a CPU through the
documented ``FALCON_RECIPE_PATH``: it puts a ``coco-albef.yaml`` there whose ``base`` is the shipped
``recipes/coco-albef.yaml`` (albef-tiny at 32 px, batch 8, a tiny BERT, ViT and BLIP judge saved locally, CPU), so
every ``coco-albef-*`` recipe, which says ``base: coco-albef``, resolves onto it, and the commands' text is what runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import socketserver
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, run_cli

TUTORIAL = REPO / "docs" / "tutorial-coco.md"
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!-- tutorial-test: (\w+)[^>]*-->")
KINDS = ("variables", "run", "resolve", "skip")
BASELINES = (
    "coco-albef",
    "coco-albef-uniform",
    "coco-albef-grit",
    "coco-albef-q0",
    "coco-albef-q05",
    "coco-albef-hardening",
    "coco-albef-softening",
    "coco-albef-mafa",
    "coco-albef-srcl",
    "coco-albef-diht",
    "coco-albef-glofnd",
)
"""The recipes users start from for Table 1 (FALCON and every baseline): the full section must train each."""


def tutorial_blocks() -> list[tuple[str, str]]:
    """``(kind, code)`` of every bash block of the tutorial, in order; a block without its marker comment on the
    line before it fails the test (a new block cannot slip past it untested)."""
    text = TUTORIAL.read_text(encoding="utf-8")
    blocks = []
    for match in BLOCK.finditer(text):
        before = text[: match.start()].rstrip().splitlines()[-1]
        marker = MARKER.fullmatch(before.strip())
        line = text[: match.start()].count("\n") + 1
        assert marker and marker.group(1) in KINDS, (
            f"docs/tutorial-coco.md line {line}: a bash block without a `<!-- tutorial-test: KIND -->` line before it "
            f"(KIND: {', '.join(KINDS)}); found {before!r}"
        )
        blocks.append((marker.group(1), match.group(1)))
    return blocks


def documented_variables(blocks) -> dict[str, str]:
    """``{NAME: value}`` of the tutorial's ``variables`` block (``export NAME=value  # comment`` lines)."""
    (code,) = [code for kind, code in blocks if kind == "variables"]
    found = {}
    for line in code.splitlines():
        match = re.fullmatch(r"export (\w+)=(\S+)\s*(#.*)?", line.strip())
        assert match, f"the variables block has a line that is not `export NAME=value`: {line!r}"
        found[match.group(1)] = match.group(2)
    return found


def test_every_bash_block_is_marked_and_the_placeholders_are_the_documented_ones():
    blocks = tutorial_blocks()
    kinds = [kind for kind, _ in blocks]
    assert kinds.count("variables") == 1 and kinds.count("run") >= 3 and kinds.count("resolve") >= 3, kinds
    assert set(documented_variables(blocks)) == {"COCO", "SMOKE", "RUNS"}
    used = set(re.findall(r"\$(\w+)", "".join(code for kind, code in blocks if kind in ("run", "resolve"))))
    assert used - {"seed", "recipe", "run", "SMALL"} == {"COCO", "SMOKE", "RUNS"}, used
    assert not any("torchrun" in code for kind, code in blocks if kind == "run"), "the smoke section runs plain falcon"
    resolve = "".join(code for kind, code in blocks if kind == "resolve")
    assert "falcon pretrain" not in resolve and "-m falcon_cli pretrain" in resolve, "the 8-GPU section uses torchrun"


# --- a tiny COCO in ALBEF's layout ----------------------------------------------------------------------------------

COLORS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 210, 40)}
SHAPES = ("circle", "square")
BACKGROUNDS = {"white": (245, 245, 245), "black": (15, 15, 15), "grey": (128, 128, 128)}


def _captions(color: str, shape: str, background: str) -> list[str]:
    return [
        f"a {color} {shape} on a {background} background",
        f"A {shape} that is {color}.",
        f"{color} {shape} in front of {background}",
        f"a picture of a {color} {shape}",
        f"the {background} background behind a {color} {shape}",
    ]


def write_albef_coco(root: Path, train: int = 24, restval: int = 4, val: int = 6, test: int = 6, seed: int = 0) -> Path:
    """What the tutorial's downloads leave in ``root``, in miniature: ALBEF's ``coco_train.json`` (one entry per
    caption, ``image_id`` ``coco_N``, Karpathy train from ``train2014/`` plus "restval" images from ``val2014/``),
    ``coco_val.json`` / ``coco_test.json`` (one entry per image, five captions), JPEGs under
    ``images/{train,val}2014/COCO_{train,val}2014_%012d.jpg`` and COCO's ``annotations/captions_val2014.json``."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    train_entries, splits, coco_images, coco_annotations = [], {"val": [], "test": []}, [], []
    layout = (
        [("train", "train2014")] * train
        + [("train", "val2014")] * restval
        + [("val", "val2014")] * val
        + [("test", "val2014")] * test
    )
    caption_id = 1
    for image_id, (split, folder) in enumerate(layout, start=1):
        name = f"{folder}/COCO_{folder}_{image_id:012d}.jpg"
        color, shape, background = rng.choice(list(COLORS)), rng.choice(SHAPES), rng.choice(list(BACKGROUNDS))
        image = Image.new("RGB", (48, 40), BACKGROUNDS[background])
        draw = ImageDraw.Draw(image)
        (draw.ellipse if shape == "circle" else draw.rectangle)((10, 6, 38, 34), fill=COLORS[color])
        (root / "images" / folder).mkdir(parents=True, exist_ok=True)
        image.save(root / "images" / name, quality=90)
        texts = _captions(color, shape, background)
        if split == "train":
            train_entries += [{"caption": text, "image": name, "image_id": f"coco_{image_id}"} for text in texts]
        else:
            splits[split].append({"image": name, "caption": texts})
        if folder == "val2014":
            coco_images.append({"id": image_id, "file_name": Path(name).name, "width": 48, "height": 40})
            for text in texts:
                coco_annotations.append({"id": caption_id, "image_id": image_id, "caption": text})
                caption_id += 1
    (root / "coco_train.json").write_text(json.dumps(train_entries))
    (root / "coco_val.json").write_text(json.dumps(splits["val"]))
    (root / "coco_test.json").write_text(json.dumps(splits["test"]))
    (root / "annotations").mkdir()
    (root / "annotations" / "captions_val2014.json").write_text(
        json.dumps({"info": {}, "licenses": [], "images": coco_images, "annotations": coco_annotations})
    )
    return root


def write_tiny_models(root: Path, texts: list[str]) -> dict[str, Path]:
    """Local stand-ins for the hub weights: a BERT (tokenizer and weights) and a timm ViT of albef-tiny's sizes, and a
    tiny BLIP ITM model with its processor (as tests/judges/test_judges.py builds it)."""
    import torch
    from safetensors.torch import save_file
    from timm.models.vision_transformer import VisionTransformer
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BlipConfig,
        BlipForImageTextRetrieval,
        BlipImageProcessor,
        BlipProcessor,
    )

    from falcon_cli.data.tokenizer import train_wordpiece_tokenizer

    torch.manual_seed(0)
    tokenizer = train_wordpiece_tokenizer(texts, root / "bert", vocab_size=200)
    BertForMaskedLM(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=192,
            num_hidden_layers=4,
            num_attention_heads=3,
            intermediate_size=768,
            max_position_embeddings=512,
        )
    ).save_pretrained(root / "bert")
    vit = VisionTransformer(img_size=64, patch_size=8, embed_dim=192, depth=4, num_heads=3, num_classes=10)
    save_file(vit.state_dict(), str(root / "deit.safetensors"))
    processor = BlipProcessor(BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer)
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
    )
    vision = dict(
        hidden_size=32, image_size=32, patch_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    BlipForImageTextRetrieval(
        BlipConfig(text_config=text, vision_config=vision, image_text_hidden_size=16, projection_dim=16)
    ).save_pretrained(root / "blip")
    processor.save_pretrained(root / "blip")
    return {"bert": root / "bert", "deit": root / "deit.safetensors", "blip": root / "blip"}


TEST_SCALE = """\
# coco-albef at test scale: the tutorial's recipes (base: coco-albef) resolve onto this file via FALCON_RECIPE_PATH
base: {base}
data: {{tokenizer: {bert}}}
pretrain:
  model: albef-tiny
  image_size: 32
  vision_weights: {deit}
  text_weights: {bert}
  batch_size: 8
  search_space_size: 24
  quantile_levels: 10
  scheduler_hidden: 16
  warmup_steps: 4
  num_workers: 0
  log_every: 1
  checkpoint_every: 0
  device: cpu
finetune: {{num_workers: 0, device: cpu, retrieval: {{batch_size: 8, image_size: 32, queue_size: 64}}}}
evaluate: {{num_workers: 0, batch_size: 16, device: cpu}}
audit: {{judge_model: {blip}, device: cpu, batch_size: 64}}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny dataset (not yet with its dataset.yaml: the tutorial writes that), the local models and the
    test-scale ``coco-albef`` in a recipe directory."""
    root = tmp_path_factory.mktemp("tutorial")
    coco = write_albef_coco(root / "coco")
    texts = [entry["caption"] for entry in json.loads((coco / "coco_train.json").read_text())]
    models = write_tiny_models(root / "models", texts)
    recipes = root / "recipes"
    recipes.mkdir()
    (recipes / "coco-albef.yaml").write_text(TEST_SCALE.format(base=REPO / "recipes" / "coco-albef.yaml", **models))
    return {"root": root, "coco": coco, "recipes": recipes, **models}


# --- falcon and torchrun on PATH, served by this process --------------------------------------------------------------

SHIM = """#!{python} -S
import json, os, socket, sys
request = {{"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]], "cwd": os.getcwd()}}
with socket.socket(socket.AF_UNIX) as conn:
    conn.connect(os.environ["FALCON_TUTORIAL_SOCKET"])
    conn.sendall(json.dumps(request).encode() + b"\\n")
    reply = json.loads(b"".join(iter(lambda: conn.recv(1 << 16), b"")))
sys.stdout.write(reply["stdout"])
sys.stderr.write(reply["stderr"])
sys.exit(reply["code"])
"""


def parse_command_line(argv: list[str]) -> tuple[str, dict]:
    """``(command path, parameters)`` of ``falcon ARGV`` as falcon's own CLI parses it, without running it; an
    unknown command or option, or a value of the wrong type, raises the CLI's usage error."""
    import typer.main

    from falcon_cli.cli.app import app

    command, args, parent, name = typer.main.get_command(app), list(argv), None, "falcon"
    while True:
        context = command.make_context(name, args, parent=parent)
        if not hasattr(command, "resolve_command"):
            return context.command_path, context.params
        rest = [*getattr(context, "_protected_args", getattr(context, "protected_args", [])), *context.args]
        name, command, args = command.resolve_command(context, rest)
        parent = context


class Commands:
    """What the shims' command lines do: ``run`` them through the CLI zygote, or ``resolve`` them (parse, and
    validate every recipe and override against the shipped recipes). Every call is recorded."""

    def __init__(self):
        self.mode = "run"
        self.calls: list[dict] = []

    def __call__(self, argv: list[str], cwd: str) -> tuple[int, str, str]:
        program, args = argv[0], argv[1:]
        if program == "torchrun":
            if self.mode != "resolve" or "-m" not in args or args[args.index("-m") + 1] != "falcon_cli":
                return 2, "", f"torchrun here: {argv} (smoke blocks run plain falcon; torchrun runs -m falcon_cli)\n"
            args = args[args.index("-m") + 2 :]
        call = {"mode": self.mode, "program": program, "args": args, "cwd": cwd}
        self.calls.append(call)
        if self.mode == "run" or args[:2] == ["data", "check"]:
            proc = run_cli(*args, cwd=Path(cwd))
            return proc.returncode, proc.stdout, proc.stderr
        try:
            call["command"], call["params"] = command, params = parse_command_line(args)
            overrides = list(params.get("overrides") or ()) + list(params.get("settings") or ())
            self.resolve(params.get("recipe") or "coco-albef", overrides)
        except Exception as exc:  # the CLI's usage errors and the recipes' FalconError alike
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            return 2, "", f"error: {' '.join(argv)}: {message}\n"
        return 0, f"resolved: {command}\n", ""

    @staticmethod
    def resolve(recipe: str, overrides: list[str]):
        """The recipe with its overrides, validated: the shipped recipes, not the test-scale one."""
        from falcon_cli.config.recipes import load_recipe

        with mock.patch.dict(os.environ):
            os.environ.pop("FALCON_RECIPE_PATH", None)
            return load_recipe(recipe, overrides)[0]


@pytest.fixture(scope="module")
def shell(tiny):
    """``run(code, mode, **variables)``: bash runs ``code`` with the shims first on PATH, in a working directory of
    its own; returns the CompletedProcess and the commands it called."""
    commands = Commands()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            request = json.loads(self.rfile.readline())
            code, out, err = commands(request["argv"], request["cwd"])
            self.wfile.write(json.dumps({"code": code, "stdout": out, "stderr": err}).encode())

    directory = Path(tempfile.mkdtemp(prefix="falcon-tut-"))  # a short path: AF_UNIX paths stop at 108 bytes
    server = socketserver.UnixStreamServer(str(directory / "socket"), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    for program in ("falcon", "torchrun"):
        (bin_dir / program).write_text(SHIM.format(python=sys.executable))
        (bin_dir / program).chmod(stat.S_IRWXU)
    work = tiny["root"] / "work"
    work.mkdir()

    def run(code: str, mode: str, **variables) -> tuple[subprocess.CompletedProcess, list[dict]]:
        commands.mode, first = mode, len(commands.calls)
        env = {
            **os.environ,
            **variables,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FALCON_TUTORIAL_SOCKET": str(directory / "socket"),
        }
        proc = subprocess.run(
            ["bash", "-c", "set -euxo pipefail\n" + code],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        return proc, commands.calls[first:]

    with pytest.MonkeyPatch.context() as patch:  # what every falcon the shims start sees (the zygote's environment)
        patch.setenv("FALCON_RECIPE_PATH", str(tiny["recipes"]))
        patch.setenv("HF_HUB_OFFLINE", "1")
        yield run
    server.shutdown()
    server.server_close()
    shutil.rmtree(directory, ignore_errors=True)


def _failed(proc) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-8000:]}"


@pytest.mark.slow  # (the whole tutorial, every stage on a tiny COCO: about 100 s on 2 cores)
def test_the_tutorial_runs_as_written(tiny, shell):
    blocks = tutorial_blocks()
    variables = {**documented_variables(blocks), "COCO": str(tiny["coco"])}
    smoke, runs = tiny["root"] / "work" / variables["SMOKE"], tiny["root"] / "work" / variables["RUNS"]

    # The smoke section, and the dataset.yaml before it: every command runs.
    proc, calls = shell("\n".join(code for kind, code in blocks if kind == "run"), "run", **variables)
    assert proc.returncode == 0, _failed(proc)
    commands = [call["args"][0] for call in calls]
    assert {name: commands.count(name) for name in set(commands)} == {
        "data": 1,
        "pretrain": 5,
        "finetune": 1,
        "audit-false-negatives": 1,
        "evaluate": 5,
        "compare": 1,
    }, commands
    trained = sorted(path.name for path in smoke.glob("coco-albef*-s*"))
    assert trained == [
        "coco-albef-grit-s0",
        "coco-albef-grit-s1",
        "coco-albef-mafa-s0",
        "coco-albef-s0",
        "coco-albef-s1",
    ], trained
    for name in trained:
        results = json.loads((smoke / name / "results" / "retrieval.json").read_text())
        assert {row["scoring"] for row in results["rows"]} == {"itc", "itc+itm@16"}, (name, results["rows"])
        assert results["meta"]["images"] == 6 and results["meta"]["false_negatives_skipped"], results["meta"]
    mafa = yaml.safe_load((smoke / "coco-albef-mafa-s0" / "config.yaml").read_text())
    con_d = smoke / "con-d-s0" / "finetune" / "retrieval" / "best"  # GRIT fine-tuned at its own resolution
    assert mafa["pretrain"]["false_negatives"]["mafa"]["judge_model"] == str(con_d), mafa["pretrain"]
    assert json.loads((con_d / "meta.json").read_text())["image_size"] == 32  # the test scale's pretraining size
    for name in ("coco-albef-s0", "coco-albef-grit-s0"):
        summary = json.loads((smoke / name / "audit" / "summary.json").read_text())
        assert "blip" in json.dumps(summary), summary
    comparison = (smoke / "comparison" / "comparison.md").read_text()
    assert all(method in comparison for method in ("coco-albef-grit", "coco-albef-mafa")), comparison

    # The 8-GPU section: every command line parses and every recipe + overrides resolves; nothing trains.
    proc, calls = shell("\n".join(code for kind, code in blocks if kind == "resolve"), "resolve", **variables)
    assert proc.returncode == 0, _failed(proc)
    assert not runs.exists(), "the resolve section trained something"
    pretrained = [call for call in calls if call.get("command") == "falcon pretrain"]
    seeds: dict[str, set] = {}
    for call in pretrained:
        params = call["params"]
        seed = [o.split("=", 1)[1] for o in params["overrides"] if o.startswith("seed=")]
        assert len(seed) == 1 and params["run_dir"].name == f"{params['recipe']}-s{seed[0]}", params
        assert str(params["run_dir"]).startswith(variables["RUNS"]), params
        seeds.setdefault(params["recipe"], set()).add(int(seed[0]))
    assert len({call["params"]["run_dir"] for call in pretrained}) == len(pretrained), "a run directory used twice"
    assert seeds == {recipe: {0, 1, 2} for recipe in BASELINES}, seeds
    done = {call.get("command") for call in calls}
    assert {
        "falcon finetune",
        "falcon embed",
        "falcon audit-false-negatives",
        "falcon evaluate retrieval",
        "falcon compare",
    } <= done, done
    compare = [call for call in calls if call.get("command") == "falcon compare"][0]
    assert compare["params"]["baseline"] == "coco-albef-grit" and "rerank:R@1" in compare["params"]["metric"], compare

    # Section 5 on the 8-GPU section's runs: each command's run directory stood in for by what it would write (its
    # resolved config, made in order, so MAFA's Con-D and SRCL's auxiliary exist when their users resolve), then
    # the tutorial's `falcon compare` for real. Every method is one row with its three seeds paired.
    values = stand_in_runs(calls, smoke / "coco-albef-s0")
    section5 = next(code for kind, code in blocks if kind == "resolve" and "falcon compare" in code)
    proc, calls = shell(section5, "run", **variables)
    assert proc.returncode == 0 and [call["args"][0] for call in calls] == ["compare"], _failed(proc)
    table = pd.read_csv(runs / "comparison" / "comparison.csv")
    rows = table[table["metric"] == "rerank:R@1"].set_index("method")
    assert sorted(rows.index) == sorted(BASELINES) and set(rows["seeds"]) == {3}, rows
    for recipe in ("coco-albef-mafa", "coco-albef-srcl"):
        row = rows.loc[recipe]
        difference = sum(values[recipe, s] - values["coco-albef-grit", s] for s in range(3)) / 3
        assert row["paired_seeds"] == 3 and row["difference"] == pytest.approx(difference, abs=1e-6), row
        assert row["difference_lo"] < difference < row["difference_hi"], row


def stand_in_runs(calls: list[dict], template: Path) -> dict[tuple[str, int], float]:
    """What the resolved commands would leave, written in their order: each pretrain, finetune and embed run
    directory's manifest (its config resolved where it runs, once the runs before it exist), a fine-tuned
    checkpoint's folder, an embeddings file, and each pretraining run's results (``template``'s, a real smoke run's,
    with every R@1 set to a per-recipe offset plus per-seed noise). Returns ``{(recipe, seed): R@1}``."""
    offsets: dict[str, int] = {}
    values: dict[tuple[str, int], float] = {}
    manifest = json.loads((template / "manifest.json").read_text())
    for call in calls:
        command, params = call.get("command", ""), call.get("params", {})
        if command not in ("falcon pretrain", "falcon finetune", "falcon embed"):
            continue
        overrides = list(params.get("overrides") or ()) + list(params.get("settings") or ())
        with contextlib.chdir(call["cwd"]):  # (as Commands resolves them)
            config = Commands.resolve(params.get("recipe") or "coco-albef", overrides)
        run = Path(call["cwd"]) / params["run_dir"]
        if run.exists():  # (fine-tuning a pretrained run: its own directory, already stood in for)
            continue
        (run / "results").mkdir(parents=True)
        stages = {"pretrain": manifest["stages"]["pretrain"]} if command == "falcon pretrain" else {}
        (run / "manifest.json").write_text(
            json.dumps(
                {
                    **manifest,
                    "seed": config.seed,
                    "world_size": 8,
                    "config": config.model_dump(mode="json"),
                    "stages": stages,
                }
            )
        )
        if command == "falcon finetune":
            (run / "finetune" / "retrieval" / "best").mkdir(parents=True)
        elif command == "falcon embed":
            (run / "embeddings").mkdir()
            (run / "embeddings" / "embeddings.h5").write_bytes(b"")
        else:
            offset = offsets.setdefault(params["recipe"], len(offsets))
            value = values[params["recipe"], config.seed] = 40.0 + offset + 0.3 * ((config.seed * 7 + offset) % 3)
            shutil.copytree(template / "audit", run / "audit")
            result = json.loads((template / "results" / "retrieval.json").read_text())
            for row in result["rows"]:
                for key in [k for k in row if k.endswith("_R@1")]:
                    row[key] = value
                row.update({"eccv_i2t_mAP@R": value / 2, "eccv_t2i_mAP@R": value / 2})  # (the full COCO's ECCV
                # Caption annotations give these; the tiny COCO has none)
            (run / "results" / "retrieval.json").write_text(json.dumps(result))
    return values


def test_a_missing_karpathy_file_is_one_line_through_the_tutorials_commands(tiny, shell, tmp_path):
    """The tutorial's own dataset.yaml and `falcon data check` on a download that lacks coco_val.json."""
    broken = tmp_path / "coco"
    shutil.copytree(tiny["coco"], broken)
    (broken / "coco_val.json").unlink()
    blocks = tutorial_blocks()
    spec = next(code for kind, code in blocks if kind == "run" and "dataset.yaml" in code)
    check = next(
        line
        for kind, code in blocks
        if kind == "run"
        for line in code.splitlines()
        if line.strip().startswith("falcon data check")
    )
    variables = {**documented_variables(blocks), "COCO": str(broken)}
    proc, calls = shell(spec + "\n" + check, "run", **variables)
    assert proc.returncode == 1 and len(calls) == 1, _failed(proc)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("+")]  # (bash -x traces start with +)
    assert len(errors) == 1 and errors[0].startswith("error:") and "coco_val.json" in errors[0], proc.stderr
    assert "file not found" in errors[0] and "dataset.yaml" in errors[0], errors
