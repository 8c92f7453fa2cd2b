"""``falcon evaluate retrieval|vqa|nlvr2 RUN_OR_CHECKPOINT``: downstream results into the run's ``results/``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from falcon_cli.artifacts.results import results_name
from falcon_cli.cli.single_stage import run_config, run_stage_in, yaml_value
from falcon_cli.errors import FalconError
from falcon_cli.runtime.console import make_console

console = make_console()
app = typer.Typer(
    help="Evaluate a run: retrieval (with false-negative-aware metrics), VQA or NLVR2.\n\n"
    "Example: falcon evaluate retrieval runs/shapes-demo",
    no_args_is_help=True,
)

TARGET = typer.Argument(
    ...,
    metavar="RUN_OR_CHECKPOINT",
    show_default=False,
    help="A run directory, or a checkpoint directory inside one (checkpoints/<step>, finetune/<task>/best).",
)
SETTINGS = typer.Option(None, "--set", help="Any evaluate.KEY=VALUE, e.g. --set evaluate.num_workers=0.")
DEVICE = typer.Option(None, "--device", help="auto, cpu or cuda[:n].")
BATCH = typer.Option(None, "--batch-size", help="Images/texts per forward and pairs per ITM re-ranking forward.")


@app.command("retrieval")
def retrieval(
    target: Path = TARGET,
    model: Optional[List[str]] = typer.Option(
        None,
        "--model",
        "-m",
        help="pretrained (zero-shot), finetuned, a "
        "checkpoint directory, or an official ALBEF/GRIT-VLP/MAFA .pth file; repeat "
        "for several rows [default: the checkpoint given, else the config's "
        "evaluate.retrieval.models].",
    ),
    split: Optional[str] = typer.Option(
        None,
        "--split",
        help="val, test, or pretrain (the pairs the run trained on, "
        "grouped by image: the memorisation gap beside test; only when given) "
        "[default: the run's evaluate.retrieval.split, test].",
    ),
    k: Optional[int] = typer.Option(None, "--k", help="ITM re-ranking depth (COCO 5K: 256, Flickr 1K: 128)."),
    itc_only: Optional[bool] = typer.Option(None, "--itc-only/--rerank", help="Rank by ITC similarity only (fast)."),
    rerank_score: Optional[str] = typer.Option(
        None,
        "--rerank-score",
        help="itm (ALBEF: the match logit), itm+itc "
        "(LAVIS's BLIP-2: plus the ITC cosine) or auto (the model's own) [default: auto].",
    ),
    false_negatives: Optional[str] = typer.Option(None, "--false-negatives", help="auto, oracle, eccv or none."),
    coco_captions: Optional[Path] = typer.Option(
        None,
        "--coco-captions",
        help="COCO's captions_val2014.json: maps the Karpathy test captions to COCO ids for ECCV Caption / CxC.",
    ),
    device: Optional[str] = DEVICE,
    batch_size: Optional[int] = BATCH,
    settings: Optional[List[str]] = SETTINGS,
) -> None:
    """Image-text retrieval: ITC for all pairs, the top k re-ranked by ITM.

    Scores TR/IR R@1/5/10 and false-negative-aware metrics: the shapes oracle's, or ECCV Caption / CxC / COCO 1K on COCO 5K. Writes results/retrieval.{json,csv,md} (with --split pretrain: results/retrieval_pretrain.*).

    Example: falcon evaluate retrieval runs/demo -m pretrained -m finetuned
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    run_dir, checkpoint = _locate(target)
    models = list(model or ([str(checkpoint)] if checkpoint is not None else []))
    _evaluate(
        "retrieval",
        run_dir,
        {
            "models": models or None,
            "split": split,
            "k": k,
            "itc_only": itc_only,
            "rerank_score": rerank_score,
            "false_negatives": false_negatives,
            "coco_captions": coco_captions,
        },
        device,
        batch_size,
        settings,
    )


@app.command("vqa")
def vqa(
    target: Path = TARGET,
    split: Optional[str] = typer.Option(None, "--split", help="val or test [default: test]."),
    k: Optional[int] = typer.Option(None, "--k", help="Candidates kept by first-token probability [default: 128]."),
    device: Optional[str] = DEVICE,
    batch_size: Optional[int] = BATCH,
    settings: Optional[List[str]] = SETTINGS,
) -> None:
    """VQA: rank the answer list with the fine-tuned decoder.

    Writes results/vqa_result_<split>.json (the server's format) and, where the split has answers, the local VQA accuracy (results/vqa.{json,csv,md}).

    Example: falcon evaluate vqa runs/shapes-demo --split test
    """  # noqa: E501 (Rich keeps a line break in help text: one line per paragraph)
    run_dir, checkpoint = _locate(target)
    _evaluate("vqa", run_dir, {"split": split, "k": k, "checkpoint": checkpoint}, device, batch_size, settings)


@app.command("nlvr2")
def nlvr2(
    target: Path = TARGET,
    split: Optional[List[str]] = typer.Option(None, "--split", help="dev and/or test (test-P) [default: both]."),
    device: Optional[str] = DEVICE,
    batch_size: Optional[int] = BATCH,
    settings: Optional[List[str]] = SETTINGS,
) -> None:
    """NLVR2: accuracy of the fine-tuned classifier on dev and test-P.

    Writes results/nlvr2.{json,csv,md}.

    Example: falcon evaluate nlvr2 runs/shapes-demo
    """
    run_dir, checkpoint = _locate(target)
    _evaluate("nlvr2", run_dir, {"splits": split, "checkpoint": checkpoint}, device, batch_size, settings)


def _locate(target: Path) -> tuple[Path, Path | None]:
    """(run directory, checkpoint directory or None) for a run directory or a checkpoint directory inside a run."""
    target = Path(target)
    if (target / "manifest.json").is_file():
        return target, None
    if (target / "model.safetensors").is_file():
        for parent in target.resolve().parents:
            if (parent / "manifest.json").is_file():
                return parent, target
        raise FalconError(
            f"{target}: a checkpoint outside any falcon run directory (no manifest.json above it); "
            "the run's tokenizer and dataset are needed"
        )
    hint = (
        (
            f"; an ALBEF/GRIT-VLP/MAFA file is evaluated in a run that gives the data and tokenizer: "
            f"falcon evaluate retrieval RUN_DIR --model {target}"
        )
        if target.is_file()
        else ""
    )
    raise FalconError(
        f"{target}: neither a falcon run directory (manifest.json) nor a checkpoint directory (model.safetensors){hint}"
    )


def _evaluate(task: str, run_dir: Path, options: dict, device, batch_size, settings) -> None:
    overrides = [f"evaluate.tasks=[{task}]"]
    overrides += [f"evaluate.{task}.{key}={yaml_value(value)}" for key, value in options.items() if value is not None]
    overrides += [
        f"evaluate.{key}={value}"
        for key, value in (("device", device), ("batch_size", batch_size))
        if value is not None
    ]
    overrides += list(settings or [])
    config = run_config(run_dir, overrides, ("evaluate",))
    if task == "retrieval" and options.get("split") is None and config.evaluate.retrieval.split == "pretrain":
        # The pretraining pairs are scored when asked for; a run scored on them before goes back to the test split.
        config = run_config(run_dir, [*overrides, "evaluate.retrieval.split=test"], ("evaluate",))
    run_stage_in(run_dir, config, "evaluate")
    name = results_name(task, config.evaluate.retrieval.split) if task == "retrieval" else task
    console.print(f"[green]done[/]: {escape(f'{run_dir}/results/{name}.md')}")
