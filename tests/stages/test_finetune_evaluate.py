"""`falcon finetune` and `falcon evaluate retrieval|vqa|nlvr2` end to end on a tiny shapes world."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import run_cli

TINY = [
    "data.shapes.images=40",
    "data.shapes.size=32",
    "pretrain.encoders.image_size=32",
    "data.tokenizer_vocab_size=200",
    "pretrain.epochs=1",
    "pretrain.batch_size=16",
    "pretrain.max_steps_per_epoch=3",
    "finetune.retrieval.max_steps_per_epoch=3",
    "pretrain.loader.augment=test",
    "pretrain.loader.num_workers=0",
    "pretrain.optim.warmup_steps=2",
    "finetune.num_workers=0",
    "finetune.retrieval.epochs=1",
    "finetune.retrieval.batch_size=8",
    "finetune.retrieval.queue_size=32",
    "finetune.retrieval.select_k=4",
    "finetune.vqa.epochs=1",
    "finetune.vqa.batch_size=16",
    "finetune.vqa.max_steps_per_epoch=2",
    "finetune.nlvr2.epochs=2",
    "finetune.nlvr2.batch_size=8",
    "finetune.nlvr2.ta_batch_size=8",
    "finetune.nlvr2.ta_max_steps=2",
    "finetune.nlvr2.max_steps_per_epoch=2",
    "evaluate.num_workers=0",
    "evaluate.retrieval.k=4",
    "evaluate.batch_size=16",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The shapes-demo chain (data → pretrain → finetune → evaluate), tiny, plus retrieval fine-tuning."""
    root = tmp_path_factory.mktemp("downstream")
    run = root / "run"
    proc = run_cli(
        "run",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        run,
        f"data.dataset={root / 'world'}",
        *TINY,
        "finetune.tasks=[retrieval, vqa, nlvr2]",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run


def rows(run, name):
    return json.loads((run / "results" / f"{name}.json").read_text())


def test_recipe_chain_writes_every_result(run_dir):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [
        s for s in ("data", "pretrain", "finetune", "evaluate") if manifest["stages"][s]["status"] == "completed"
    ] == ["data", "pretrain", "finetune", "evaluate"]
    for task in ("retrieval", "vqa", "nlvr2"):
        best = run_dir / "finetune" / task / "best"
        assert (best / "model.safetensors").is_file() and json.loads((best / "meta.json").read_text())["task"] == task
        for suffix in ("json", "csv", "md"):
            assert (run_dir / "results" / f"{task}.{suffix}").is_file()
    assert (run_dir / "finetune" / "nlvr2" / "text_assignment" / "best" / "model.safetensors").is_file()
    # No progress bar here (FALCON_PROGRESS=0), yet log.txt shows each epoch of each training loop.
    log = (run_dir / "log.txt").read_text()
    assert "pretrain epoch 1/1: steps 3, loss " in log and "pairs per s" in log
    assert "finetune vqa epoch 1/1: steps 2, loss " in log and "finetune nlvr2 epoch 2/2: " in log

    retrieval = rows(run_dir, "retrieval")
    assert retrieval["meta"]["false_negatives"] == "oracle" and retrieval["meta"]["units"] == "percent"
    assert "false_negatives_skipped" not in retrieval["meta"] and "coco_ids" not in retrieval["meta"]
    assert [(r["model"], r["scoring"]) for r in retrieval["rows"]] == [
        ("pretrained", "itc"),
        ("pretrained", "itc+itm@4"),
    ]
    for row in retrieval["rows"]:
        for key in ("i2t_R@1", "t2i_R@10", "mean_R", "oracle_i2t_R@1", "oracle_t2i_R-P", "oracle_i2t_mAP@R"):
            assert 0.0 <= row[key] <= 100.0, key
        # Every own caption is also a true match, so the oracle's R@K can only be higher.
        assert row["oracle_i2t_R@1"] >= row["i2t_R@1"] and row["oracle_t2i_R@5"] >= row["t2i_R@5"]
    # The ITC row is the same ranking the pretrain stage's zero-shot evaluation measured: captions are cut
    # where pretraining cut them (pretrain.encoders.max_text_length, 25), not at a length of evaluate's own.
    assert [r["max_text_length"] for r in retrieval["rows"]] == [25, 25]
    zero_shot = rows(run_dir, "retrieval_zeroshot")["rows"][-1]
    # On a shapes world the zero-shot numbers come false-negative aware too, the same as evaluate's.
    for key in (
        "i2t_R@1",
        "i2t_R@5",
        "t2i_R@1",
        "t2i_R@5",
        "mean_R",
        "oracle_i2t_R@1",
        "oracle_t2i_R@5",
        "oracle_mean_R",
        "oracle_t2i_mAP@R",
    ):
        assert retrieval["rows"][0][key] == pytest.approx(zero_shot[key], abs=1e-6), key

    # VQA: every test question answered once, from the candidate list, in the server's format.
    questions = json.loads((run_dir.parent / "world" / "vqa_test.json").read_text())
    answers = json.loads((run_dir.parent / "world" / "answer_list.json").read_text())
    result = json.loads((run_dir / "results" / "vqa_result_test.json").read_text())
    assert [r["question_id"] for r in result] == [q["question_id"] for q in questions]
    assert all(r["answer"] in answers for r in result)
    assert rows(run_dir, "vqa")["meta"]["answer_processing"] == "official"
    vqa = rows(run_dir, "vqa")["rows"][0]
    assert vqa["split"] == "test" and 0.0 <= vqa["accuracy"] <= 100.0 and vqa["questions"] == len(questions)

    nlvr2 = rows(run_dir, "nlvr2")
    assert [r["split"] for r in nlvr2["rows"]] == ["dev", "test"]
    assert all(0.0 <= r["accuracy"] <= 100.0 for r in nlvr2["rows"])
    history = json.loads((run_dir / "finetune" / "nlvr2" / "best" / "meta.json").read_text())
    assert history["metric"] == "dev_accuracy" and history["epoch"] in (0, 1)


def test_evaluate_a_checkpoint_and_both_models(run_dir):
    checkpoint = run_dir / "finetune" / "retrieval" / "best"
    proc = run_cli("evaluate", "retrieval", checkpoint, "--itc-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = rows(run_dir, "retrieval")
    assert [(r["model"], r["scoring"]) for r in result["rows"]] == [(str(checkpoint), "itc")]
    assert not (run_dir / "results" / "near_misses.json").exists()  # the demo world has no near-miss families
    proc = run_cli(
        "evaluate",
        "retrieval",
        run_dir,
        "--model",
        "pretrained",
        "--model",
        "finetuned",
        "--rerank",
        "--k",
        "3",
        "--false-negatives",
        "none",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = rows(run_dir, "retrieval")
    assert [(r["model"], r["scoring"]) for r in result["rows"]] == [
        ("pretrained", "itc"),
        ("pretrained", "itc+itm@3"),
        ("finetuned", "itc"),
        ("finetuned", "itc+itm@3"),
    ]
    assert [r["max_text_length"] for r in result["rows"]] == [25, 25, 30, 30]  # pretrain's and finetune's limits
    assert "oracle_i2t_R@1" not in result["rows"][0] and result["meta"]["k"] == 3
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config"]["evaluate"]["retrieval"]["models"] == ["pretrained", "finetuned"]
    assert manifest["config"]["pretrain"]["epochs"] == 1  # the training record is untouched


def test_the_trained_text_length_of_a_checkpoint(tmp_path):
    """meta.json says it; a checkpoint written before that key falls back to its run's config; an official
    file says nothing (evaluate then uses ALBEF's 30)."""
    from falcon_cli.models.pretrained import trained_text_length

    run = tmp_path / "run"
    (run / "checkpoints" / "000008").mkdir(parents=True)
    (run / "finetune" / "retrieval" / "best").mkdir(parents=True)
    (run / "config.yaml").write_text("pretrain:\n  max_text_length: 40\nfinetune:\n  max_text_length: 35\n")
    assert trained_text_length(run / "checkpoints" / "000008") == 40
    assert trained_text_length(run / "finetune" / "retrieval" / "best") == 35
    (run / "checkpoints" / "000008" / "meta.json").write_text(json.dumps({"step": 8, "max_text_length": 20}))
    assert trained_text_length(run / "checkpoints" / "000008") == 20
    assert trained_text_length(tmp_path / "ALBEF_4M.pth") is None
    alone = tmp_path / "copied" / "000008"
    alone.mkdir(parents=True)
    assert trained_text_length(alone) is None


def test_resume_after_the_last_epoch_trains_nothing(run_dir):
    best = run_dir / "finetune" / "nlvr2" / "best" / "meta.json"
    before = best.read_text()
    proc = run_cli("finetune", "--run-dir", run_dir, "--task", "nlvr2", "--resume")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed nlvr2" in proc.stderr and best.read_text() == before


@pytest.mark.slow  # (about 35 s on 2 cores; make test keeps pretraining's preempted runs)
def test_a_preempted_fine_tuning_checkpoints_its_step_and_resumes_exactly(run_dir, tmp_path):
    """SIGTERM in the middle of retrieval fine-tuning's first epoch: the step is finished and checkpointed, exit 75;
    --resume continues from that batch: the losses of every step and the kept weights are the uninterrupted run's."""
    import re
    import shutil
    import signal

    from safetensors.torch import load_file

    from falcon_cli.runtime.metrics import read_metrics
    from tests.conftest import signal_past_step

    longer = ["finetune.retrieval.epochs=2", "finetune.retrieval.max_steps_per_epoch=12", "finetune.log_every=1"]
    reference, preempted = tmp_path / "reference", tmp_path / "preempted"
    for copy in (reference, preempted):
        shutil.copytree(run_dir, copy)
    args = ["finetune", "--run-dir", "RUN", "--task", "retrieval", "--overwrite", *longer]
    proc = run_cli(*[str(reference) if a == "RUN" else a for a in args])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = preempted / "finetune" / "retrieval" / "metrics.jsonl"
    log.unlink()  # (the fixture's own fine-tuning logged these steps already)
    code, stderr = signal_past_step([str(preempted) if a == "RUN" else a for a in args], log, 3, signal.SIGTERM)
    assert code == 75, stderr[-3000:]
    line = re.search(
        r"preempted: SIGTERM at epoch 0, step (\d+) \((\d+) batches of the epoch done\): saved \S+", stderr
    )
    assert line and 3 <= int(line[1]) < 12 and line[1] == line[2], stderr[-3000:]
    resumed = run_cli("finetune", "--run-dir", preempted, "--task", "retrieval", "--resume", *longer)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed retrieval" in resumed.stderr
    expected = read_metrics(reference / "finetune" / "retrieval" / "metrics.jsonl")
    got = read_metrics(log)
    assert [r["step"] for r in got] == [r["step"] for r in expected] and len(got) > 20
    for a, b in zip(expected, got):
        for key in ("loss", "itc", "itm", "lr", "r_mean"):
            if a.get(key) is not None:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key, a[key], b[key])
    ref, new = (load_file(d / "finetune" / "retrieval" / "best" / "model.safetensors") for d in (reference, preempted))
    assert all(torch.allclose(ref[k], new[k], rtol=1e-4, atol=1e-6) for k in ref)


def test_finetuning_again_from_scratch_replaces_the_earlier_history(run_dir, tmp_path):
    import shutil

    from falcon_cli.runtime.metrics import read_metrics

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    log = copy / "finetune" / "nlvr2" / "metrics.jsonl"
    before = [(r.get("kind"), r["step"]) for r in read_metrics(log)]
    proc = run_cli("finetune", "--run-dir", copy, "--task", "nlvr2", "--overwrite")  # not --resume: trains it again
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(r.get("kind"), r["step"]) for r in read_metrics(log)] == before  # once, not twice


def test_fine_tuning_clips_the_gradient_norm_when_asked(run_dir, tmp_path):
    """``finetune.<task>.grad_clip`` (the shared update step's clipping): a tiny limit changes every step after the
    first; unset, the steps are the ones fine-tuning always made."""
    import shutil

    from falcon_cli.runtime.metrics import read_metrics

    losses = {}
    for clip in (None, 1e-4):
        copy = tmp_path / f"run-{clip}"
        shutil.copytree(run_dir, copy)
        extra = [] if clip is None else [f"finetune.vqa.grad_clip={clip}"]
        proc = run_cli("finetune", "--run-dir", copy, "--task", "vqa", "--overwrite", "finetune.log_every=1", *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        losses[clip] = [r["loss"] for r in read_metrics(copy / "finetune" / "vqa" / "metrics.jsonl") if "loss" in r]
    assert len(losses[None]) == len(losses[1e-4]) >= 2
    assert losses[None][0] == losses[1e-4][0] and losses[None][1:] != losses[1e-4][1:]


def test_finetuning_over_a_tasks_checkpoints_is_refused_without_resume_or_overwrite(run_dir, tmp_path):
    """Like pretraining: a task's checkpoints are never trained over by accident; nothing changes."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    task = copy / "finetune" / "nlvr2"
    before = {p.relative_to(task): p.read_bytes() for p in task.rglob("*") if p.is_file()}
    proc = run_cli("finetune", "--run-dir", copy, "--task", "nlvr2")
    assert proc.returncode != 0
    assert "already holds nlvr2 fine-tuning checkpoints" in " ".join(proc.stderr.split())
    assert "--resume" in proc.stderr and "--overwrite" in proc.stderr and "Traceback" not in proc.stderr
    assert {p.relative_to(task): p.read_bytes() for p in task.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "args, message",
    [
        (["evaluate", "retrieval", "/nonexistent/run"], "neither a falcon run directory"),
        (["evaluate", "retrieval", "RUN", "--set", "pretrain.epochs=3"], "only evaluate.* keys"),
        (["evaluate", "retrieval", "RUN", "--false-negatives", "eccv"], "COCO Karpathy 5K test split"),
        (
            [
                "evaluate",
                "retrieval",
                "RUN",
                "--false-negatives",
                "eccv",
                "--coco-captions",
                "/nonexistent/captions.json",
            ],
            "COCO Karpathy 5K test split",
        ),
        (["finetune", "--run-dir", "RUN", "--task", "captioning"], "--task captioning: unknown task"),
        (["finetune", "--run-dir", "RUN", "finetune.retrieval.queue_size=30", "--task", "retrieval"], "not a multiple"),
    ],
)
def test_bad_input_is_one_line(run_dir, args, message):
    before = (run_dir / "manifest.json").read_text()
    proc = run_cli(*[str(run_dir) if a == "RUN" else a for a in args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    if "eccv" not in args:  # rejected before the run was touched (the ECCV ids are checked by the stage)
        assert (run_dir / "manifest.json").read_text() == before


def test_vqa_needs_a_finetuned_model(tmp_path, run_dir):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("finetune"))
    proc = run_cli("evaluate", "vqa", run)
    assert proc.returncode == 2 and "falcon finetune --task vqa" in proc.stderr, proc.stderr


def test_an_official_albef_checkpoint_file_in_evaluate_finetune_and_pretrain(run_dir, tmp_path):
    """The run's pretrained weights saved as ALBEF saves them (.pth, its key names): evaluated with --model,
    fine-tuned from with finetune.checkpoint, pretrained from with pretrain.encoders.init; each sees exactly those
    weights."""
    import shutil

    from falcon_cli.models import ALBEF, create_model, model_from_weights, save_weights
    from falcon_cli.models.pretrained import albef_from_checkpoint, find_checkpoint
    from tests.albef_files import write_albef_checkpoint

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("finetune"))
    pretrained = albef_from_checkpoint(find_checkpoint(run, "test"))
    pth = write_albef_checkpoint(pretrained, tmp_path / "ALBEF.pth")
    # ALBEF's files do not say how features are pooled: ALBEF's [CLS] pooling is read; the same weights with it:
    as_albef = ALBEF(pretrained.config.model_copy(update={"pooling": "cls"}))
    as_albef.load_state_dict(pretrained.state_dict())
    (tmp_path / "cls").mkdir()
    save_weights(as_albef, tmp_path / "cls" / "model.safetensors")

    proc = run_cli(
        "evaluate",
        "retrieval",
        run,
        "--model",
        tmp_path / "cls",
        "--model",
        pth,
        "--itc-only",
        "--false-negatives",
        "none",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    same, official = rows(run, "retrieval")["rows"]
    assert official["model"] == str(pth) and official["checkpoint"] == str(pth)
    assert {k: v for k, v in official.items() if "R" in k} == {k: v for k, v in same.items() if "R" in k}

    proc = run_cli(
        "finetune",
        "--run-dir",
        run,
        "--task",
        "retrieval",
        f"finetune.checkpoint={pth}",
        "finetune.retrieval.epochs=0",
        "finetune.retrieval.image_size=null",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    best = model_from_weights(run / "finetune" / "retrieval" / "best" / "model.safetensors")
    for key, value in as_albef.state_dict().items():
        assert torch.equal(best.state_dict()[key], value), key

    # A file with another vocabulary than the run's tokenizer: one line, before any scoring.
    other = write_albef_checkpoint(create_model("albef-tiny", vocab_size=333, pooling="cls"), tmp_path / "other.pth")
    proc = run_cli("evaluate", "retrieval", run, "--model", other, "--itc-only")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "vocabulary has 333 tokens but the run's tokenizer has" in proc.stderr and "bert-base-uncased" in proc.stderr

    # pretrain.encoders.init: a new run on the same world (same tokenizer) starts from the file, so its untrained
    # zero-shot retrieval is the source run's trained one.
    fresh = tmp_path / "fresh"
    proc = run_cli(
        "pretrain",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        fresh,
        f"data.dataset={run_dir.parent / 'world'}",
        *TINY,
        f"pretrain.encoders.init={pth}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    untrained = rows(fresh, "retrieval_zeroshot")["rows"][0]
    trained = rows(run_dir, "retrieval_zeroshot")["rows"][-1]
    assert untrained["model"] == "untrained"
    for key in ("i2t_R@1", "i2t_R@5", "t2i_R@1", "t2i_R@5", "mean_R"):
        assert untrained[key] == pytest.approx(trained[key], abs=1e-9), key
