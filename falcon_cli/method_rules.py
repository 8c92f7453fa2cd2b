"""Each false-negative method's settings on a testbed, derived from its paper's by a written rule, not by hand.

A paper sets its method for its own data and schedule (GloFND: filtering starts after 15 of 37 epochs on CC3M, its
thresholds learn at lr 0.05, α = 5e-4 of a batch's negatives). A testbed trains another number of epochs, on data
with another false-negative rate. Four rules carry a setting over (docs/methods.md, "Settings by rule"):

* ``schedule``: a point in training keeps its fraction of the training (epoch 15 of 37 is epoch 15 of 36);
* ``rate``: a learning rate scales with the number of updates each parameter gets, so that it travels as far
  (GloFND's thresholds are updated once per epoch from their start: lr × (paper's updates / testbed's));
* ``data``: a quantity tied to the data is set from the world's measured statistics (GloFND's α, the share of an
  anchor's negatives taken as false, is the share that truly match, measured on the tuning world's training pairs);
* ``paper``: a setting tied to neither (MAFA's label smoothing 0.5) is the paper's own.

And ``tuned``: the one setting each paper names as the most sensitive gets at most two candidate values, each
trained once (seed 0) on a separate tuning world (the same preset, another world seed), and the value with the
higher false-negative-aware ITC R@1 on that world's test split is kept: every method gets the same budget, and
nothing is chosen on the evaluation world. Uniform and GRIT batches have no setting of their own and no tuning.

Plain data and arithmetic (no torch): :func:`method_settings` gives a method's config overrides on a testbed,
:func:`rules_table` the tables docs/methods.md shows, and a test checks that the two and the sweep agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from falcon_cli.artifacts.atomic import write_text


@dataclass(frozen=True)
class Testbed:
    """What the rules read of a testbed: its schedule and its data's measured false-negative rate."""

    name: str
    epochs: int
    """Pretraining epochs."""
    batch: int
    """Pairs per batch (per process)."""
    pairs: int
    """Pretraining pairs: each pair is in one batch an epoch."""
    false_negative_rate: float
    """The share of a random anchor's in-batch negatives that truly match it, on the tuning world's training pairs
    (``world.json``: ``statistics.false_negative_density.train.pair_negative_fn_rate``)."""

    @property
    def steps_per_epoch(self) -> int:
        return self.pairs // self.batch


DENSE = Testbed("dense", epochs=36, batch=64, pairs=4500, false_negative_rate=0.178827)
"""The `dense` testbed (``benchmarks/phase_sweep.py``'s ``cpu`` budget): 900 training images with five captions
each, 36 epochs of batch 64. Its false-negative rate is the tuning world's (``--set world_seed=1``), measured by the
world generator: 0.178827 (the evaluation world's is 0.180980)."""


COCO = Testbed("coco", epochs=20, batch=384, pairs=566_747, false_negative_rate=0.001)
"""The COCO recipes (``coco-albef-*``): 20 epochs of 96 pairs on each of 4 GPUs (the FALCON paper's global batch
384), COCO's 566,747 training pairs; a random COCO negative is a false negative about 0.05–0.15% of the time
(ECCV Caption's annotations), so 0.1%."""

COCO_RECIPES = {
    "glofnd": ("coco-albef-glofnd", 8),
    "mafa": ("coco-albef-mafa", 0.98),
    "srcl": ("coco-albef-srcl", 5.0),
    "diht": ("coco-albef-diht", 0.5),
    "falcon": ("coco-albef", None),
}
"""Each method's COCO recipe and the candidate of its tuned setting that the recipe trains, untuned on COCO: GloFND
the paper's first start (15 of 37), MAFA the 0.98 FALCON's COCO reproduction needed, SRCL falcon's default δ, DiHT
the middle of the sweep."""


def schedule(paper_epoch: float, paper_epochs: float, testbed: Testbed) -> int:
    """``schedule``: the testbed epoch at the same fraction of training as ``paper_epoch`` of ``paper_epochs``."""
    return int(round(paper_epoch / paper_epochs * testbed.epochs))


def rate(paper_lr: float, paper_updates: float, testbed_updates: float) -> float:
    """``rate``: the learning rate that takes a parameter as far in ``testbed_updates`` updates as ``paper_lr`` does
    in ``paper_updates`` (an Adam step is about lr, whatever the gradient's scale), to four significant digits."""
    return float(f"{paper_lr * paper_updates / testbed_updates:.4g}")


@dataclass(frozen=True)
class Setting:
    """One config key of a method: the paper's value, the rule, and the testbed's value."""

    key: str
    """The ``pretrain.*`` key."""
    paper: str
    """The paper's setting, in words, with where it is stated."""
    rule: str
    """``schedule``, ``rate``, ``data``, ``paper``, ``tuned`` or ``base`` (the base every arm shares)."""
    value: Callable[[Testbed, dict], object] | None
    """The testbed's value from the testbed and the method's tuned values (``{key: value}``); None for the tuned
    setting itself (its value is the tuning's)."""
    how: str
    """How the rule gives the value, in words."""
    candidates: Callable[[Testbed], tuple] | None = None
    """``tuned``: the (at most two) values the tuning runs try."""


@dataclass(frozen=True)
class MethodRules:
    """A false-negative method's settings on a testbed, each by its rule."""

    method: str
    """``pretrain.false_negatives.method``."""
    paper: str
    settings: tuple[Setting, ...]
    needs_run: str | None = None
    """A finished run of the same (world, seed) whose checkpoint the method reads (MAFA's Con-D, SRCL's auxiliary
    model): the sweep arm's name."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def tuned(self) -> Setting | None:
        return next((s for s in self.settings if s.rule == "tuned"), None)


def _glofnd_start(testbed: Testbed) -> tuple[int, int]:
    return schedule(15, 37, testbed), schedule(20, 37, testbed)


def _glofnd_lr(testbed: Testbed, tuned: dict) -> float:
    """The paper's 0.05 over the updates a threshold gets from its start epoch (one per epoch: each pair is in one
    batch an epoch, there and here), carried to the testbed's start."""
    start = tuned["pretrain.false_negatives.glofnd.start_epoch"]
    paper_start = {s: p for s, p in zip(_glofnd_start(testbed), (15, 20))}[start]
    return rate(0.05, 37 - paper_start, testbed.epochs - start)


RULES: dict[str, MethodRules] = {
    "glofnd": MethodRules(
        "glofnd",
        "GloFND (Balmaseda et al.), bimodal CC3M: 37 epochs, global batch 1,024 (App. D.2)",
        settings=(
            Setting(
                "pretrain.false_negatives.glofnd.start_epoch",
                "after 15 (SogCLR) or 20 (FastCLIP) of 37 epochs, tuned over {15, 20} (D.2)",
                "tuned",
                None,
                "the two by `schedule`: round(15/37 × epochs), round(20/37 × epochs); the paper's own tuning "
                "set (it tunes α too, which `data` sets here)",
                candidates=_glofnd_start,
            ),
            Setting(
                "pretrain.false_negatives.glofnd.lr",
                "0.05 (Adam, β 0.9 / 0.98), λ from 1 (D.2)",
                "rate",
                _glofnd_lr,
                "0.05 × (37 − paper start) / (epochs − start): one update per threshold per epoch in both",
            ),
            Setting(
                "pretrain.false_negatives.glofnd.alpha",
                "5e-4 (SogCLR) or 1e-3 (FastCLIP) of a batch's negatives (D.2)",
                "data",
                lambda t, tuned: round(t.false_negative_rate, 3),
                "the share of a random anchor's negatives that truly match, on the tuning world's training pairs "
                "(the share α asks GloFND to take as false); one α for every anchor, as in the paper",
            ),
            Setting(
                "pretrain.false_negatives.glofnd.adam_step",
                "t = epoch + 1 in Adam's bias correction (the authors' code)",
                "paper",
                lambda t, tuned: "epoch",
                "as the paper's code",
            ),
        ),
        notes=("GloFND is CLIP-only: ITM and MLM are ALBEF's, mined from the unfiltered similarities.",),
    ),
    "mafa": MethodRules(
        "mafa",
        "MAFA (Byun et al.), ALBEF on 4M: 20 epochs, batch 96, GRIT batches (§5.1)",
        settings=(
            Setting(
                "pretrain.false_negatives.mafa.high",
                "τ = 0.8 (§4.1, its code); FALCON's COCO reproduction needed 0.98 (0.8 collapsed; FALCON Tab. 7)",
                "tuned",
                None,
                "the two values used by the paper and by FALCON's reproduction; MAFA's Tab. 15 finds "
                "τ the stable one, FALCON's the one that broke",
                candidates=lambda t: (0.8, 0.98),
            ),
            Setting(
                "pretrain.false_negatives.mafa.low",
                "0.5: ambiguous band 0.5 < p < τ (§4.1)",
                "paper",
                lambda t, tuned: 0.5,
                "a probability of the discriminator's: not tied to data or schedule",
            ),
            Setting(
                "pretrain.false_negatives.mafa.smoothing",
                "S-ITC α = 0.5 (its code, Tab. 2; robust over 0.1–0.7, Tab. 18)",
                "paper",
                lambda t, tuned: 0.5,
                "a label-smoothing mass: not tied to data or schedule",
            ),
            Setting(
                "pretrain.false_negatives.mafa.judge",
                "Con-D: the same architecture trained on the same pretraining data "
                "(GRIT + S-ITC), fine-tuned on COCO retrieval (§4.1)",
                "base",
                lambda t, tuned: "checkpoint",
                "the same seed's uniform run on the same world (its ITM head, not fine-tuned): a model trained "
                "on the same data, as the paper's; never the oracle",
            ),
        ),
        needs_run="uniform-cpu",
        notes=(
            "Its batches are the base's uniform ones, not GRIT's: every arm differs from uniform in its method "
            "alone (GRIT's effect is the GRIT arm's).",
            "S-ITC starts at epoch 1 (its code: epoch 0 is GRIT's random epoch), one epoch here too.",
        ),
    ),
    "srcl": MethodRules(
        "srcl",
        "SRCL, ALBEF on 4M: 30 epochs, batch 512 (App. D)",
        settings=(
            Setting(
                "pretrain.false_negatives.srcl.delta",
                "δ, the weights' scale: not given (App. D); false negatives weighted about 0.12 (App. F)",
                "tuned",
                None,
                "falcon's reconstruction w ∝ softmax(−δ cos): 5 (its default) and 10, which put a negative "
                "0.3 in cosine above the rest at weights 0.22 and 0.05, around the paper's 0.12",
                candidates=lambda t: (5.0, 10.0),
            ),
            Setting(
                "pretrain.false_negatives.srcl.mix_until",
                "α falls from 1 as training goes on (§3.2.1; schedule not given)",
                "schedule",
                lambda t, tuned: 1.0,
                "linearly from 1 to 0 over the whole training (S-2): the fraction 1.0",
            ),
            Setting(
                "pretrain.false_negatives.srcl.aux_embeddings",
                "H_β: the same structure trained with InfoNCE on COCO (§3.2.1)",
                "base",
                lambda t, tuned: "the same seed's uniform run",
                "the same seed's uniform run on the same world, embedded once (`falcon embed`)",
            ),
        ),
        needs_run="uniform-cpu",
    ),
    "diht": MethodRules(
        "diht",
        "DiHT's HN-NCE (Radenovic et al., 2023), as the FALCON paper re-implemented it in ALBEF (App. C.3)",
        settings=(
            Setting(
                "pretrain.false_negatives.diht.beta",
                "β, the hardness: not in the FALCON paper, which re-implemented the loss; "
                "DiHT's suggested sweep {0.25, 0.5, 1}",
                "tuned",
                None,
                "the two lower values of the sweep: a search space's hardest candidate is a true match about half "
                "the time in this world's preset, and β = 1 weights the hardest most",
                candidates=lambda t: (0.25, 0.5),
            ),
            Setting(
                "pretrain.false_negatives.diht.alpha",
                "α = 1 (the positive's weight; sweep {0.999, 1})",
                "paper",
                lambda t, tuned: 1.0,
                "the standard InfoNCE positive",
            ),
        ),
    ),
    "falcon": MethodRules(
        "falcon",
        "FALCON (Kim et al.), ALBEF on COCO: 20 epochs, batch 96 × 4 GPUs (Tab. 5)",
        settings=(
            Setting(
                "pretrain.scheduler.lr",
                "1e-4 (Adam), one update per step from epoch 1 (Tab. 5)",
                "rate",
                lambda t, tuned: rate(1e-4, 566_747 // 384 * 19, t.steps_per_epoch * (t.epochs - 1)),
                "1e-4 × (COCO's 1,475 steps × 19 epochs) / (steps_per_epoch × (epochs − 1)): the scheduler is "
                "updated once per step after the first epoch",
            ),
            Setting(
                "pretrain.composer.search_space_size",
                "search spaces of 1,920 pairs (Tab. 5)",
                "base",
                lambda t, tuned: 500,
                "the composers' shared search-space size (GRIT's and q = 0.5's arms use it too)",
            ),
        ),
        notes=(
            "Paper-exact FALCON in `dense` (issue 70) runs at this rate: `shapes-falcon` with "
            "`pretrain.scheduler.lr=1.144e-3` (`benchmarks/phase_sweep.py`'s `falcon-paper-rate`); the `shapes-falcon` "
            "recipe keeps 1e-3, set for the demo's 250 FALCON steps. Issue 70's candidate A "
            "(`shapes-falcon-start-top`) uses it too.",
        ),
    ),
}
"""Every false-negative method's rules (and FALCON's), in docs/methods.md's order."""

TUNING_WORLD_SEED = 1
"""The tuning world: the same preset as the evaluation world (world seed 0), generated with this seed."""
TUNING_SEED = 0
"""The one training seed each tuning run uses."""
TUNING_METRIC = "oracle_R@1"
"""What the tuning runs are compared by: the mean of i2t and t2i false-negative-aware ITC R@1 on the tuning world's
test split (the number that can move in a world this dense; docs/results.md)."""

TUNED: dict[str, dict[str, object]] = {
    "glofnd": {"pretrain.false_negatives.glofnd.start_epoch": 15},
    "mafa": {"pretrain.false_negatives.mafa.high": 0.98},
    "srcl": {"pretrain.false_negatives.srcl.delta": 10.0},
    "diht": {"pretrain.false_negatives.diht.beta": 0.5},
}
"""The values the tuning runs chose on the `dense` tuning world (``{method: {key: value}}``), recorded with the runs
they were chosen from in docs/results/dense_tuning.csv; a method missing here is chosen from the tuning runs."""


def candidates(method: str, testbed: Testbed = DENSE) -> tuple:
    """The values a method's tuning runs try (empty for a method with no tuned setting)."""
    setting = RULES[method].tuned
    return () if setting is None or setting.candidates is None else tuple(setting.candidates(testbed))


def method_settings(method: str, tuned_value: object, testbed: Testbed = DENSE) -> dict[str, object]:
    """``{key: value}`` of ``method`` on ``testbed`` with its tuned setting at ``tuned_value`` (one of
    :func:`candidates`), for every key a rule sets (the ``base`` settings are the sweep's to fill in)."""
    rules = RULES[method]
    tuned = {rules.tuned.key: tuned_value} if rules.tuned is not None else {}
    if rules.tuned is not None and tuned_value not in candidates(method, testbed):
        raise ValueError(
            f"{rules.tuned.key}={tuned_value!r}: not one of the tuning candidates {candidates(method, testbed)}"
        )
    return {
        s.key: tuned[s.key] if s.rule == "tuned" else s.value(testbed, tuned)
        for s in rules.settings
        if s.rule != "base"
    }


def select(results: dict[object, float]) -> object:
    """The tuned value with the higher :data:`TUNING_METRIC` (``{value: metric}``); the first on a tie."""
    return max(results, key=lambda value: results[value])


def _cell(value: object) -> str:
    if isinstance(value, tuple):
        return " or ".join(_cell(v) for v in value)
    return f"`{value}`" if not isinstance(value, str) or not value.startswith("the ") else value


def rules_table(method: str, testbed: Testbed = DENSE) -> list[str]:
    """The markdown table of ``method``'s settings: the paper's, the rule, the testbed's (both candidates for the
    tuned one, the chosen one marked once :data:`TUNED` holds it)."""
    rules = RULES[method]
    recipe, coco_value = COCO_RECIPES[method]
    coco = method_settings(method, coco_value, COCO)
    lines = [
        f"**{rules.method}**: {rules.paper}. Testbed `{testbed.name}`: {testbed.epochs} epochs of batch "
        f"{testbed.batch}, {testbed.pairs:,} pairs, false-negative rate {testbed.false_negative_rate:.3f}; "
        f"`{recipe}`: {COCO.epochs} epochs of global batch {COCO.batch}, {COCO.pairs:,} pairs, false-negative rate "
        f"{COCO.false_negative_rate:g}.",
        "",
        f"| key | the paper | rule | the testbed | `{recipe}` | how |",
        "|---|---|---|---|---|---|",
    ]
    chosen = TUNED.get(method, {})
    for s in rules.settings:
        if s.rule == "tuned":
            values = candidates(method, testbed)
            value = " or ".join(f"**`{v}`**" if chosen.get(s.key) == v else f"`{v}`" for v in values)
        elif s.rule == "rate" and rules.tuned is not None and rules.tuned.key not in chosen:
            value = " or ".join(_cell(method_settings(method, v, testbed)[s.key]) for v in candidates(method, testbed))
        else:
            tuned_value = chosen.get(rules.tuned.key) if rules.tuned is not None else None
            if rules.tuned is not None and tuned_value is None:
                tuned_value = candidates(method, testbed)[0]
            value = _cell(s.value(testbed, {rules.tuned.key: tuned_value} if rules.tuned is not None else {}))
        lines.append(
            f"| `{s.key}` | {s.paper} | {s.rule} | {value} | {_cell(coco[s.key]) if s.key in coco else '—'} | {s.how} |"
        )
    return lines + [""] + [f"- {note}" for note in rules.notes] + ([""] if rules.notes else [])


__all__ = [
    "Testbed",
    "DENSE",
    "COCO",
    "COCO_RECIPES",
    "Setting",
    "MethodRules",
    "RULES",
    "TUNED",
    "TUNING_WORLD_SEED",
    "TUNING_SEED",
    "TUNING_METRIC",
    "schedule",
    "rate",
    "candidates",
    "method_settings",
    "select",
    "rules_table",
    "rules_markdown",
]


RULES_BEGIN, RULES_END = "<!-- rules:begin -->", "<!-- rules:end -->"
"""The markers around the tables in docs/methods.md that :func:`rules_markdown` writes."""


def rules_markdown(testbed: Testbed = DENSE) -> list[str]:
    """Every method's :func:`rules_table`, the block docs/methods.md shows between :data:`RULES_BEGIN` and
    :data:`RULES_END` (``python -m falcon_cli.method_rules docs/methods.md`` rewrites it)."""
    lines = [
        "<!-- Generated by `python -m falcon_cli.method_rules docs/methods.md`; edit falcon_cli/method_rules.py. -->",
        "",
    ]
    for method in RULES:
        lines += rules_table(method, testbed)
    return lines


def main(argv: list[str] | None = None) -> None:
    """Rewrite the rules block of the page named on the command line (docs/methods.md)."""
    import sys
    from pathlib import Path

    (page,) = argv if argv is not None else sys.argv[1:]
    text = Path(page).read_text()
    if RULES_BEGIN not in text or RULES_END not in text:
        raise SystemExit(f"{page}: no {RULES_BEGIN} ... {RULES_END} block; add the two markers where the tables go")
    head, rest = text.split(RULES_BEGIN, 1)
    write_text(
        Path(page),
        head + RULES_BEGIN + "\n" + "\n".join(rules_markdown()) + "\n" + RULES_END + rest.split(RULES_END, 1)[1],
    )
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
