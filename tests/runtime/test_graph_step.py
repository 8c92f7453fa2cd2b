"""`pretrain.runtime.graph_step`: the step captured whole, checked on the CPU.

* Dynamo captures ALBEF's forward and every loss with 0 graph breaks, for the plain ITC, DiHT, GloFND, the momentum
  ITC, SRCL, sampled ITM negatives and the same-image mask (the composers only choose which pairs come in: the step
  is the same for all of them; FALCON's whole run is the CLI test below).
* The captured step computes what the eager one does (losses and every gradient, within 1e-5).
* The pieces that make its shapes fixed equal what they replace: MLM weighting its masked positions, ITM negatives
  drawn from uniforms, captions padded to one length.
* A FALCON run with the captured step resumes exactly after a preemption, and trains under DDP; MAFA and
  ``compile`` are refused.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from falcon_cli.config.recipes import load_recipe
from falcon_cli.frameworks import build_objective, model_framework
from falcon_cli.models.registry import create_model
from falcon_cli.objectives import false_negatives as methods
from falcon_cli.objectives.mlm import IGNORE_INDEX, MlmMask, mlm_loss
from falcon_cli.runtime.graph_step import TrainingForward

pytestmark = pytest.mark.slow  # (torch.compile: `make test-all`)

B, L, VOCAB, PAIRS = 6, 10, 120, 40


def objective_for(variant: str, seed: int = 0):
    """albef-tiny's objective with the shapes-demo settings, for one captured-step variant."""
    overrides = {"momentum": ["pretrain.losses.itc=momentum"], "sample": ["pretrain.losses.itm_negatives=sample"]}.get(
        variant, []
    )
    p = load_recipe("shapes-demo", overrides)[0].pretrain
    torch.manual_seed(seed)
    model = create_model("albef-tiny", vocab_size=VOCAB)
    method = {
        "diht": lambda: methods.Diht(beta=0.5),
        "glofnd": lambda: methods.Glofnd(list(range(PAIRS)), start_epoch=0),
        "srcl": lambda: methods.Srcl(auxiliary_features().get, delta=5.0),
    }
    objective = build_objective(model_framework("albef-tiny"), model, p.losses, method.get(variant, lambda: None)())
    objective.eval()  # (dropout off: its draws are the one thing the two paths may not share)
    if variant == "momentum":
        objective.queue = type(objective.queue)(model.config.embed_dim, 4 * B)  # (a queue a few batches long)
    return objective


def auxiliary_features():
    """SRCL's frozen auxiliary model's features of every pair (random, fixed)."""
    from falcon_cli.sampling.cache import EmbeddingCache

    g = torch.Generator().manual_seed(5)
    cache = EmbeddingCache(torch.arange(PAIRS), 256)
    cache.update(torch.arange(PAIRS), *torch.nn.functional.normalize(torch.randn(2, PAIRS, 256, generator=g), dim=-1))
    return cache


def step_inputs(variant: str, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(B, 3, 64, 64, generator=g)
    ids = torch.randint(5, VOCAB, (B, L), generator=g)
    attention = torch.ones_like(ids)
    attention[0, 7:] = 0  # (a padded caption)
    ids[0, 7:] = 0
    mask = MlmMask.sample(
        ids, attention, probability=0.3, generator=g, vocab_size=VOCAB, mask_token_id=3, pad_token_id=0, cls_token_id=1
    )
    same = None
    if variant == "same_image":
        same = torch.zeros(B, B, dtype=torch.bool)
        same[0, 1] = same[1, 0] = True
    context = methods.StepContext(torch.arange(B) * 3, 1, 5, 50, same)
    return (images, ids, attention, mask), context


VARIANTS = ["none", "diht", "srcl", "glofnd", "momentum", "sample", "same_image"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_dynamo_captures_the_albef_step_without_a_graph_break(variant):
    objective = objective_for(variant)
    objective.fixed_shapes = True
    inputs, context = step_inputs(variant)
    itm = torch.rand(2, B) if variant == "sample" else None

    context = dataclasses.replace(context, progress=torch.tensor(0.1))  # (as TrainingForward passes it)

    def step(*inputs):
        return objective(*inputs, torch.tensor(0.4), itm, context).loss

    explained = torch._dynamo.explain(step)(*inputs)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize("variant", ["none", "srcl", "glofnd", "momentum", "sample"])
def test_the_captured_step_computes_what_the_eager_one_does(variant):
    """The same objective twice (the same weights): eager with fixed shapes, and through TrainingForward's captured
    step (aot_eager: Dynamo's graph and AOTAutograd's forward and backward, no code generation): every loss part,
    feature and gradient within 1e-5, and the state the step changes (the momentum queue, GloFND's thresholds).
    SRCL: the eager step computes its mixing weight from the step number, the captured one from the progress tensor."""
    eager, graphed = objective_for(variant), objective_for(variant)
    eager.fixed_shapes = True
    graphed.load_state_dict(eager.state_dict())
    if variant == "glofnd":
        graphed.false_negatives.load_state_dict(eager.false_negatives.state_dict())
    inputs, context = step_inputs(variant)
    forward = TrainingForward(
        graphed, "fp32", torch.device("cpu"), graph=True, sample_itm=variant == "sample", backend="aot_eager"
    )
    generators = [torch.Generator().manual_seed(7) for _ in range(2)]
    results = []
    for step in range(2):  # (the second call replays the compiled graph: GloFND and the queue carry state)
        uniforms = torch.rand(2, B, generator=generators[0]) if variant == "sample" else None
        out_eager = eager(*inputs, 0.4, uniforms, context)
        out_graph = forward(inputs, 0.4, generators[1], context)
        for module, out in ((eager, out_eager), (graphed, out_graph)):
            module.zero_grad(set_to_none=True)
            out.loss.backward()
        results.append((out_eager, out_graph))
        for name, a, b in zip(out_eager._fields, out_eager, out_graph):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"step {step}: {name}")
        for (name, a), b in zip(eager.named_parameters(), graphed.parameters()):
            if a.grad is not None or b.grad is not None:
                torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-5, msg=f"step {step}: grad of {name}")
    state_eager, state_graph = eager.state_dict(), graphed.state_dict()
    for name in state_eager:
        torch.testing.assert_close(state_graph[name], state_eager[name], msg=name)
    if variant == "glofnd":
        torch.testing.assert_close(
            graphed.false_negatives.thresholds.lambda_image, eager.false_negatives.thresholds.lambda_image
        )


def test_the_captured_step_under_inductor_matches_too():
    """The compiler users run (inductor: generated C++ on the CPU), once, on the plain step."""
    eager, graphed = objective_for("none"), objective_for("none")
    eager.fixed_shapes = True
    graphed.load_state_dict(eager.state_dict())
    inputs, context = step_inputs("none")
    out_graph = TrainingForward(graphed, "fp32", torch.device("cpu"), graph=True)(inputs, 0.0, None, context)
    out_eager = eager(*inputs, 0.0, None, context)
    for name, a, b in zip(out_eager._fields, out_eager, out_graph):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    out_eager.loss.backward()
    out_graph.loss.backward()
    for (name, a), b in zip(eager.named_parameters(), graphed.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_mlm_over_every_position_equals_the_mean_over_the_masked_ones():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, 30, generator=g, requires_grad=True)
    labels = torch.randint(0, 30, (4, 9), generator=g)
    labels[torch.rand(4, 9, generator=g) > 0.3] = IGNORE_INDEX
    gathered, dense = mlm_loss(logits, labels), mlm_loss(logits, labels, fixed_shape=True)
    torch.testing.assert_close(dense, gathered)
    reference = torch.nn.functional.cross_entropy(logits[labels != IGNORE_INDEX], labels[labels != IGNORE_INDEX])
    torch.testing.assert_close(dense, reference)
    grads = [
        torch.autograd.grad(loss, logits)[0]
        for loss in (mlm_loss(logits, labels), mlm_loss(logits, labels, fixed_shape=True))
    ]
    torch.testing.assert_close(grads[1], grads[0])
    nothing = torch.full_like(labels, IGNORE_INDEX)
    assert float(mlm_loss(logits, nothing, fixed_shape=True).detach()) == 0.0  # (0, not NaN, as the gathered one)


def test_itm_negatives_drawn_from_uniforms_follow_the_weights_and_never_an_excluded_pair():
    from falcon_cli.objectives.itm import inverse_cdf_draw, sample_negatives

    weights = torch.tensor([[0.0, 1.0, 3.0, 0.0, 4.0], [2.0, 0.0, 0.0, 2.0, 0.0]])
    n = 200_000
    draws = inverse_cdf_draw(
        weights.repeat_interleave(n, 0), torch.rand(2 * n, generator=torch.Generator().manual_seed(0))
    )
    for row in range(2):
        counts = torch.bincount(draws[row * n : (row + 1) * n], minlength=5).double() / n
        torch.testing.assert_close(counts, (weights[row] / weights[row].sum()).double(), atol=5e-3, rtol=0)
    sim = torch.randn(6, 6)
    same = torch.zeros(6, 6, dtype=torch.bool)
    same[0, 1] = same[1, 0] = True
    for seed in range(50):
        neg_text, neg_image = sample_negatives(
            sim, sim.t(), torch.rand(2, 6, generator=torch.Generator().manual_seed(seed)), positive_mask=same
        )
        for negatives in (neg_text, neg_image):
            assert not bool((negatives == torch.arange(6)).any()), "never the positive"
            assert int(negatives[0]) != 1 and int(negatives[1]) != 0, "never a pair of the same image"


def test_captions_padded_to_one_length():
    from falcon_cli.data.collate import CaptionTokens

    class Tokenizer:
        pad_token_id, padding_side = 0, "right"

        def __call__(self, texts, truncation, max_length):
            return {"input_ids": [[1, *range(5, 5 + len(t.split()))][:max_length] for t in texts]}

    texts = ["a red square", "a small blue circle left of it"]
    ids, attention = CaptionTokens(Tokenizer(), 12)(texts)
    fixed_ids, fixed_attention = CaptionTokens(Tokenizer(), 12, fixed_length=True)(texts)
    assert ids.shape == (2, 8) and fixed_ids.shape == fixed_attention.shape == (2, 12)
    assert torch.equal(fixed_ids[:, :8], ids) and not fixed_ids[:, 8:].any() and not fixed_attention[:, 8:].any()
    assert torch.equal(fixed_attention[:, :8], attention)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["pretrain.false_negatives.method=mafa"], "cannot capture false_negatives.method=mafa: it asks the host"),
        (["pretrain.runtime.compile=true"], "set one of them"),
    ],
)
def test_what_the_captured_step_cannot_hold_is_refused_with_one_line(tmp_path, overrides, expected):
    from tests.conftest import run_cli

    done = run_cli(
        "pretrain",
        "--recipe",
        "shapes-demo",
        "--run-dir",
        str(tmp_path / "run"),
        "pretrain.runtime.graph_step=true",
        *overrides,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0] and "graph_step" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


GRAPHED = [
    "pretrain.composer.name=falcon",
    "pretrain.epochs=2",
    "pretrain.checkpoints.every=4",
    "pretrain.losses.itm_negatives=sample",
    "pretrain.runtime.graph_step=true",
    "pretrain.runtime.graph_backend=aot_eager",
    "pretrain.runtime.device=cpu",
]


def test_a_falcon_run_with_the_captured_step_resumes_exactly(tmp_path):
    """FALCON with the captured step and sampled ITM negatives (uniforms from the checkpointed ITM generator):
    preempted inside its FALCON epoch and resumed, it logs the uninterrupted run's losses, rewards and batches and
    ends with its weights."""
    from safetensors.torch import load_file

    from tests.conftest import assert_same_training, preempt_and_resume, run_cli
    from tests.stages.test_pretrain import pretrain_args

    world = tmp_path / "world"
    reference = tmp_path / "reference"
    done = run_cli(*pretrain_args(reference, world, *GRAPHED))
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "run"
    preempt_and_resume(pretrain_args(run_dir, world, *GRAPHED), run_dir, 12)
    assert_same_training(reference, run_dir, ("loss", "itc", "itm", "mlm", "reward"))
    final = f"{int((reference / 'checkpoints' / 'latest').read_text()):08d}"
    ref, got = (load_file(d / "checkpoints" / final / "model.safetensors") for d in (reference, run_dir))
    assert ref.keys() == got.keys() and all(torch.allclose(ref[k], got[k], rtol=1e-4, atol=1e-6) for k in ref)


@pytest.mark.parametrize(
    "recipe, model, srcl",
    [
        ("shapes-demo", "albef-tiny", False),
        ("shapes-demo", "albef-tiny", True),
        ("shapes-blip2", "blip2-tiny", False),
        ("shapes-siglip", "dual-tiny", False),
    ],
)
def test_one_graph_serves_every_step_of_each_framework(recipe, model, srcl):
    """ALBEF (and with SRCL, whose mixing weight changes every step), BLIP-2 stage 1 and a dual encoder: three steps
    (a new step number, epoch and batch each time) through the captured step are one compile, with no graph break
    (fullgraph) and no recompile."""
    graphs = []

    def counting_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    p = load_recipe(recipe, [])[0].pretrain
    framework = model_framework(model)
    torch.manual_seed(0)
    method = methods.Srcl(auxiliary_features().get) if srcl else None
    objective = build_objective(framework, create_model(model, vocab_size=VOCAB), p.losses, method)
    forward = TrainingForward(objective, "fp32", torch.device("cpu"), graph=True, backend=counting_backend)
    for step in range(3):
        (images, ids, attention, mask), _ = step_inputs("none", seed=step)
        size = objective.model.config.image_size
        images = torch.nn.functional.interpolate(images, size=(size, size)) if size != 64 else images
        context = methods.StepContext(torch.arange(B) + 10 * step, step // 2, step, 50, None)
        out = forward((images, ids, attention, mask if framework.masked_language else None), 0.0, None, context)
        out.loss.backward()
        assert torch.isfinite(out.loss)
    assert len(graphs) == 1, f"{len(graphs)} graphs for 3 steps"


def test_under_ddp_the_captured_step_trains_as_dynamo_alone_does(tmp_path):
    """Two processes (gloo): the objective's call is compiled inside DDP, so DDP's gradient hooks fire as
    AOTAutograd's compiled backward produces the gradients. The run (aot_eager: traced forward and backward) logs the
    losses and ends with the weights of the same run with Dynamo's capture alone (its graph run by eager autograd,
    hook by hook), and the same batches."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from tests.conftest import assert_same_training
    from tests.stages.test_pretrain import pretrain_args
    from tests.torchrun_nodes import ENV, REPO

    world = tmp_path / "world"
    runs = {}
    for backend in ("eager", "aot_eager"):
        run_dir = tmp_path / backend
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "falcon_cli",
            *map(
                str,
                pretrain_args(
                    run_dir,
                    world,
                    *GRAPHED[:3],
                    "pretrain.batch_size=8",
                    "pretrain.runtime.graph_step=true",
                    "pretrain.runtime.device=cpu",
                    f"pretrain.runtime.graph_backend={backend}",
                ),
            ),
        ]
        done = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        runs[backend] = run_dir
    assert_same_training(runs["eager"], runs["aot_eager"], ("loss", "itc", "itm", "mlm", "reward"))
    final = f"{int((runs['eager'] / 'checkpoints' / 'latest').read_text()):08d}"
    ref, got = (load_file(d / "checkpoints" / final / "model.safetensors") for d in runs.values())
    # (atol 1e-5: attention's key biases, whose true gradient is 0 (softmax ignores a shift), take Adam's steps of
    # rounding noise, a few 1e-6 apart after 20 steps; every other weight agrees far closer)
    assert ref.keys() == got.keys() and all(torch.allclose(ref[k], got[k], rtol=1e-4, atol=1e-5) for k in ref)
