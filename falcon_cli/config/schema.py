"""Typed configuration: one section per stage, a docstring on every field.

A recipe (``recipes/*.yaml``) is validated against :class:`Recipe`. Unknown keys are
rejected (with the nearest valid key, see :mod:`falcon_cli.config.recipes`), values are
parsed to the field's type, and the resolved config is written into the run directory.
Later stages add their own sections here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from falcon_cli.config.paths import InputPath
from falcon_cli.data.shapes.config import ShapesConfig
from falcon_cli.errors import FalconError
from falcon_cli.frameworks import model_framework
from falcon_cli.method_weights import ITC_CONSISTENCY_WEIGHT
from falcon_cli.models.registry import get_model_config
from falcon_cli.runtime.loggers import LoggerName

StageName = Literal[
    "data", "unimodal", "embed", "build_search_spaces", "pretrain", "audit_false_negatives", "finetune", "evaluate"
]
"""The stages a recipe can chain, in the order they may run."""

STAGE_ORDER: tuple[str, ...] = (
    "data",
    "unimodal",
    "embed",
    "build_search_spaces",
    "pretrain",
    "audit_false_negatives",
    "finetune",
    "evaluate",
)

PER_PAIR_REWARDS = (
    "mlm",
    "itg",
    "caption",
    "alignment",
    "positive_margin",
    "positive_margin+itm",
    "positive_margin+oracle",
)
"""Rewards measured per pair, which a per-step ``scheduler_credit`` can hand to single q's."""

TaskName = Literal["retrieval", "vqa", "nlvr2"]
"""ALBEF's downstream tasks: image-text retrieval, VQA and NLVR2."""


def _distinct_loggers(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError(f"loggers must be distinct, got {names}")
    return names


Loggers = Annotated[list[LoggerName], AfterValidator(_distinct_loggers)]
"""``pretrain.loggers`` / ``finetune.loggers``: where the metrics go (:mod:`falcon_cli.runtime.loggers`)."""


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, every field has a docstring (read by
    falcon_cli.field_docs, not at class creation: a fast CLI)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    """Which dataset a run uses, how it is checked, and which tokenizer reads its captions."""

    dataset: Annotated[Path | None, InputPath()] = None
    """The dataset spec: a ``dataset.yaml`` file or the directory holding one (relative paths are
    relative to the working directory). None (only with ``shapes``): the generated world goes into the
    run directory, ``<run>/world``, never into the working directory by accident."""

    shapes: ShapesConfig | None = None
    """If set, generate a shapes world with these settings at ``dataset`` when it is missing
    (an existing world with the same settings is reused)."""

    on_missing: Literal["fail", "skip"] | None = None
    """Missing images: ``fail`` stops with the count and the first paths, ``skip`` drops those
    entries and records how many in the manifest. Default: the spec's own ``on_missing``."""

    verify_images: bool = True
    """Open every image once during the data check (catches unreadable files, costs a pass over the images)."""

    tokenizer: Annotated[str, InputPath(when="exists", keywords=("wordpiece",))] = "wordpiece"
    """``wordpiece`` trains a BERT-style WordPiece tokenizer on the training captions and saves it in
    the run (offline); anything else is a hub id (``bert-base-uncased``) or a local directory. Non-BERT
    tokenizers load too, e.g. a dual encoder's (``timm/ViT-B-16-SigLIP``'s SentencePiece,
    ``openai/clip-vit-base-patch16``'s BPE; padded with their eos token when they have no pad token)."""

    tokenizer_vocab_size: int = Field(1000, ge=16)
    """Vocabulary size when ``tokenizer`` is ``wordpiece``."""

    @model_validator(mode="after")
    def _dataset_or_world(self) -> "DataConfig":
        if self.dataset is None and self.shapes is None:
            raise ValueError(
                "data.dataset is required (a dataset.yaml or the directory holding one) unless data.shapes "
                "generates a world, which then goes into the run directory"
            )
        return self


FalseNegativeMethod = Literal["none", "mafa", "srcl", "diht", "glofnd"]
"""The values of ``pretrain.false_negatives``."""


class MafaConfig(Section):
    """MAFA (``pretrain.false_negatives: mafa``): efficient connection mining with a frozen
    connection discriminator, plus S-ITC label smoothing (docs/methods.md)."""

    judge: Literal["oracle", "blip", "checkpoint"] = "checkpoint"
    """The connection discriminator that scores each anchor's hardest in-batch candidate: a falcon
    ``checkpoint``'s ITM head (the paper's Con-D), ``blip`` (a BLIP ITM head), or the shapes world's
    ``oracle`` (an upper bound: a perfect discriminator)."""

    judge_model: Annotated[str | None, InputPath(when="exists")] = None
    """``checkpoint``: a falcon run or checkpoint directory (required); ``blip``: a hub id or local
    directory (None = ``Salesforce/blip-itm-base-coco``)."""

    high: float = Field(0.8, ge=0.0, le=1.0)
    """p(match) above this turns the hardest negative into a positive (ITC target, ITM label, extra MLM
    pair). MAFA: 0.8; FALCON's COCO reproduction needed 0.98."""

    low: float = Field(0.5, ge=0.0, le=1.0)
    """Between ``low`` and ``high`` the candidate is ambiguous: ITM uses the second-hardest negative."""

    smoothing: float = Field(0.5, ge=0.0, le=1.0)
    """S-ITC label smoothing α of the ITC targets, from epoch 1 on (0 in epoch 0)."""

    mlm_pairs: Literal["per_direction", "distinct"] = "per_direction"
    """Extra MLM pairs: one per conversion (``per_direction``, MAFA's code: a pair converted from
    both its image and its caption joins the MLM set twice) or one per distinct converted pair
    (``distinct``). Extra pairs reuse their caption's mask (MAFA masks each appended row afresh)."""

    batch_size: int = Field(64, ge=1)
    """Pairs per discriminator forward pass (model discriminators)."""

    fp16: bool = False
    """Run a model discriminator in fp16 autocast (CUDA only)."""


class SrclConfig(Section):
    """SRCL (``pretrain.false_negatives: srcl``): negatives weighted by a frozen auxiliary model's and
    the current model's similarity (a reconstruction; docs/methods.md)."""

    aux_embeddings: Annotated[Path | None, InputPath()] = None
    """The frozen auxiliary model's features of every pretraining pair, an ``embeddings.h5`` from
    ``falcon embed``; None = the run's own ``embeddings/embeddings.h5``."""

    delta: float = Field(5.0, ge=0.0)
    """Sharpness of the weights ``w = (N - 1) softmax_j(-delta * cos_mix)``: 0 = plain InfoNCE; larger
    down-weights negatives that look like the anchor more strongly."""

    mix_until: float = Field(1.0, gt=0.0)
    """The auxiliary model's share α falls linearly from 1 to 0 over this fraction of training."""


class DihtConfig(Section):
    """DiHT's HN-NCE (``pretrain.false_negatives: diht``): importance-weighted hard negatives."""

    beta: float = Field(0.5, ge=0.0)
    """Hardness β of both directions: negatives weighted by ``(N - 1) softmax_j(β · logits)``; 0 = InfoNCE."""

    alpha: float = Field(1.0, gt=0.0, le=1.0)
    """Weight α of the positive in the denominator (1 = InfoNCE's)."""


class GlofndConfig(Section):
    """GloFND (``pretrain.false_negatives: glofnd``): per-pair learned similarity thresholds; negatives
    above them are dropped from the ITC denominators."""

    alpha: float = Field(0.01, gt=0.0, lt=1.0)
    """The fraction of each anchor's negatives taken as false: λ tracks the (1 − α)-quantile of its similarities."""

    lr: float = Field(0.05, gt=0.0)
    """Adam learning rate of the thresholds (betas 0.9, 0.98)."""

    start_epoch: int = Field(1, ge=0)
    """First epoch in which thresholds are learned and negatives dropped."""

    adam_step: Literal["epoch", "count"] = "epoch"
    """The step count t of the threshold Adam's bias correction (1 − β^t): ``epoch`` = the 0-based
    training epoch + 1 for every pair (the authors' code, so the baseline reproduces it); ``count`` =
    each pair's own number of updates (textbook per-index Adam). They differ when ``start_epoch`` > 0:
    ``epoch`` takes smaller first steps (0.74 × lr from epoch 1, 0.46 × lr from epoch 15)."""


class PretrainConfig(Section):
    """ALBEF pretraining: model, objectives, batch composition, optimisation, checkpoints."""

    # -- model ---------------------------------------------------------------------------
    model: str = "albef-tiny"
    """Model config name from the registry (``albef-base``, ``albef-tiny``, ``blip2-base``, ``siglip2-b16``,
    ``clip-b16``, ``dual-tiny``; see falcon_cli/models/configs): its ``framework`` picks ALBEF, BLIP-2 or a dual
    encoder."""
    image_size: int | None = Field(None, ge=8)
    """Input resolution in pixels (default: the model config's; albef-base pretrains at 256)."""
    vision_weights: Annotated[str | None, InputPath(when="exists", keywords=("unimodal",))] = None
    """Image-encoder weights: a timm name (``timm:deit_base_patch16_224.fb_in1k``) or a local file; ``unimodal`` = the
    shapes world's DeiT analogue that the ``unimodal`` stage trained for this run's world, model and seed; None =
    random init. A dual encoder: the whole open_clip model's weights, a pretrained tag (``webli``, ``openai``) or a
    checkpoint file."""
    text_weights: Annotated[str | None, InputPath(when="exists", keywords=("unimodal",))] = None
    """Text/fusion weights: a hub id (``bert-base-uncased``) or a local directory; ``unimodal`` = the shapes world's
    BERT analogue from the ``unimodal`` stage; None = random init."""
    vision_trainable_epochs: int = Field(0, ge=0)
    """BLIP-2 models: the image encoder trains for this many first epochs, then stays frozen. BLIP-2 freezes a
    pretrained encoder throughout (0, the default); a small run without a pretrained encoder (the shapes
    recipes) trains its tiny ViT in epoch 0, where every composer is uniform, and freezes it from epoch 1."""
    init: Annotated[str | None, InputPath()] = None
    """Start from a whole official ALBEF / GRIT-VLP / MAFA checkpoint (their ``.pth`` file): every weight of
    ``model`` is loaded from it (key mapping in docs/pretraining.md), the position embeddings resized to
    ``image_size``; its momentum copies and queues are skipped. ``model`` must have the checkpoint's
    architecture (``albef-base`` for the released ones) and the run's tokenizer its vocabulary
    (``data.tokenizer: bert-base-uncased``). None = ``vision_weights``/``text_weights`` or random init."""

    # -- objectives ------------------------------------------------------------------------
    itc: Literal["grit", "momentum"] = "grit"
    """ITC variant: ``grit`` (in-batch, soft pseudo targets, FALCON's default) or ``momentum`` (ALBEF's
    distillation)."""
    itc_consistency_weight: float | None = Field(None, ge=0.0)
    """Weight of GRIT-VLP's ITC consistency (soft pseudo target) term. None (the default) = the
    method's own (``false_negatives``): 0.2 for ``none`` (GRIT-VLP, FALCON), 0 for ``mafa``, ``srcl``,
    ``diht`` and ``glofnd``, whose papers do not train it. Resolved when the config is validated,
    so the run's config.yaml, its manifest and ``falcon recipes show`` hold the number trained."""
    momentum: float = Field(0.995, ge=0, lt=1)
    """EMA momentum of the momentum encoders (``itc: momentum``)."""
    queue_size: int = Field(65536, ge=1)
    """Feature-queue length (``itc: momentum``); must be a multiple of the global batch."""
    distill_alpha: float = Field(0.4, ge=0, le=1)
    """Distillation weight α, ramped linearly over epoch 0 (``itc: momentum``)."""
    caption_weight: float = Field(1.0, ge=0)
    """Dual encoders: weight of the captioning decoder's loss beside the contrastive loss (SigLIP 2: 1; CoCa: 2);
    0 with a model without a decoder."""
    itm_negatives: Literal["hardest", "sample"] = "hardest"
    """ITM negatives: the hardest in-batch negative per anchor (GRIT/FALCON) or ALBEF's multinomial sampling."""
    mlm_probability: float = Field(0.5, gt=0, le=1)
    """MLM masking probability (0.5 in GRIT/FALCON, 0.15 in ALBEF)."""
    max_text_length: int = Field(25, ge=2)
    """Token limit of captions (the reference uses 25)."""

    # -- batches ---------------------------------------------------------------------------
    composer: Literal["uniform", "grit", "quantile", "progressive", "falcon"] = "grit"
    """How mini-batches are composed: ``uniform`` random; ``grit`` (GRIT-VLP's hardest-negative chain);
    ``quantile`` (FALCON's Algorithm 1 with a fixed q); ``progressive`` (q moving linearly over the
    epochs); ``falcon`` (q from the learned scheduler). Epoch 0 is uniform for all of them."""
    batch_size: int = Field(32, ge=2)
    """Batch size PER PROCESS (the global batch = batch_size × world size, printed at start)."""
    search_space_size: int = Field(1920, ge=2)
    """GRIT search-space size |M| (pairs grouped together; a multiple of batch_size is natural)."""
    search_spaces: Annotated[str | None, InputPath(keywords=("run",))] = None
    """Warm start: compose epoch 0 (grit, quantile, progressive, falcon) from these built search spaces
    (a ``search_spaces.parquet``, or ``run`` for this run's own, from build-search-spaces) and the
    embeddings that built them (``search_spaces.embeddings``, default this run's embeddings/embeddings.h5)
    instead of uniform batches; None = epoch 0 uniform. Later epochs use the model's own features."""
    drop_last: bool = False
    """Drop each rank's last partial batch (GRIT's code does; falcon keeps it by default so every pair is seen).
    The quantile composers and FALCON cut each search space on its own: with True, each space's last partial
    batch is dropped (``|M| % batch_size`` pairs per space); with False it is trained as a smaller batch."""

    # -- quantile composers and the FALCON scheduler ---------------------------------------------
    quantile: float = Field(1.0, ge=0, le=1)
    """q of ``composer: quantile`` (1 = the most similar remaining pair, 0.5 = the median, 0 = the least similar)."""
    progressive_start: float = Field(0.0, ge=0, le=1)
    """q of ``composer: progressive`` at epoch 1 (hardening: 0 -> 1; softening: set 1 and ``progressive_end: 0``)."""
    progressive_end: float = Field(1.0, ge=0, le=1)
    """q of ``composer: progressive`` at the last epoch (linear in between)."""
    scheduler_level: Literal["instance", "batch"] = "instance"
    """FALCON: one q per anchor (``instance``, the paper's default) or one per batch, drawn from its first pair's
    Beta."""
    quantile_scale: Literal["linear", "log_rank"] = "linear"
    """How a quantile composer's q picks among a step's n candidates (every composer that draws q: fixed,
    progressive, FALCON): ``linear``, the paper's, the q-quantile of their similarities (q = 0.94 of 500 is the 31st
    most similar); ``log_rank``, the k-th most similar with k = round(n^(1 - q)) (q = 1 the most similar, q = 0 the
    least; q = 0.94 of 500 the most similar, q = 0.9 the 2nd), so that a Beta over q can put real mass on the top
    few candidates, where GRIT's picks are (docs/results.md: FALCON in the testbed, five paired seeds)."""
    quantile_levels: int = Field(100, ge=2)
    """m: quantiles per similarity row (the scheduler's input width)."""
    quantile_temperature: float = Field(1.0, gt=0)
    """Ŝ = softmax(Q / this); 1 = raw cosine sums (methods.md A-1)."""
    scheduler_features: list[Literal["softmax", "zscore", "positive", "spread"]] = Field(
        default_factory=lambda: ["softmax"], min_length=1
    )
    """The scheduler's input, groups concatenated (falcon_cli/sampling/scheduler_features.py): ``softmax``
    (the paper's Ŝ, τ = quantile_temperature), ``zscore`` (the quantiles standardised per row),
    ``positive`` (where the anchor's own pair sits in its row: the share of candidates more similar than
    it, likely false negatives), ``spread`` (the row's standard deviation and range)."""
    scheduler_hidden: int = Field(256, ge=1)
    """Hidden width of the scheduler MLP."""
    scheduler_blocks: int = Field(2, ge=0)
    """Residual blocks of the scheduler MLP (2: four linear layers)."""
    scheduler_lr: float = Field(1e-4, gt=0)
    """Scheduler AdamW learning rate."""
    scheduler_weight_decay: float = Field(0.01, ge=0)
    """Scheduler AdamW weight decay."""
    scheduler_grad_clip: float | None = Field(None, gt=0)
    """Clip the scheduler's gradient norm (None: no clipping, as in the paper)."""
    reward: Literal[
        "mlm",
        "itg",
        "caption",
        "itc",
        "itc+itm",
        "itc+itm+mlm",
        "itc+itm+itg",
        "itc+caption",
        "alignment",
        "positive_margin",
        "positive_margin+itm",
        "positive_margin+oracle",
    ] = "mlm"
    """The scheduler's reward: the decrease of this loss on the batch, before vs after the VLP update.
    ``mlm`` and ``itc+itm+mlm`` for ALBEF models, ``itg`` and ``itc+itm+itg`` for BLIP-2 (which has no MLM:
    the paper's Table 3 uses its image-grounded text generation loss), ``caption``, ``itc`` and ``itc+caption`` for
    dual encoders (``caption``: the decoder's captioning loss, SigLIP 2's reward in the later FALCON paper; ``itc``:
    the model's contrastive loss, sigmoid or InfoNCE). ``alignment`` (ours): the rise of each pair's own image-text
    cosine (a false negative next to it pulls its pair apart), per pair with a per-step ``scheduler_credit``.
    ``positive_margin`` (ours): no loss decrease but each pick's similarity to its anchor, charged
    ``1 + reward_overshoot`` times for every bit it rises above the anchor's own pair (a likely false negative); read
    from the training forward's features (no extra pass), with ``scheduler_credit: chosen``. ``positive_margin+itm``
    (ours, ALBEF and BLIP-2): the positive margin less ``reward_itm_weight`` times the model's own ITM match probability
    of the pick with its anchor (the mean over anchor image with pick caption and pick image with anchor caption), so a
    pick the model itself believes matches its anchor (a likely false negative) pays less, at any hardness; one no-grad
    eval-mode pass of the fusion layers over the batch's 2(B - 1) chained pairs. A dual encoder has no ITM head:
    there ``positive_margin`` stands in, since its only judgement of a pair is the similarity the margin reads.
    ``positive_margin+oracle`` (ours, a diagnostic on a shapes world, every framework): the same charge with the
    world's ground truth as the judge (p = 1 for a pick that truly matches its anchor, else 0), which no real run
    has: what a perfect judge of the picks would buy the scheduler, the ceiling of every ``+itm`` charge."""
    reward_overshoot: float = Field(1.0, ge=0)
    """``reward: positive_margin``: how much more a pick loses per unit of similarity above its anchor's own
    pair than it gains per unit below (0: the reward falls flat past the pair)."""
    reward_margin: float = Field(0.0, ge=0)
    """``reward: positive_margin``: the charge starts this far below the anchor's own pair (in units of
    the composer's similarity S, which spans [-2, 2]): a larger margin moves every anchor's best q down."""
    reward_itm_weight: float = Field(2.0, ge=0)
    """``reward: positive_margin+itm`` (or ``+oracle``): the charge per unit of the judge's match probability of a
    pick with its anchor (0: the positive margin alone). 2 spans the composer's similarity S (in [-2, 2]), so a pick the
    head is sure of loses as much as the hardest pick can win."""
    reward_hardness: Literal["margin", "rank"] = "margin"
    """``reward: positive_margin+itm`` (or ``+oracle``): what a pick's hardness is worth before its judge's charge.
    ``margin``: the positive margin (its similarity to the anchor, charged past the anchor's own pair less
    ``reward_margin``); ``rank``: its rank among the anchor's candidates, 0 the easiest, 1 the hardest (the batch's
    ``quantile_rank``; under ``scheduler_credit: levels`` each level's q): every anchor's hardness on one scale,
    whatever its own pair, so that only the judge says where hard stops paying. With ``reward_itm_charge: expected``
    a true pick is worth its rank and a false one ``-reward_itm_weight``. Needs a judge (a rank alone pays for
    harder without end)."""
    reward_itm_charge: Literal["absolute", "excess", "expected"] = "absolute"
    """``reward: positive_margin+itm`` (or ``+oracle``, whose p is 0 or 1): what a pick is charged for.
    ``absolute``: the ITM match probability itself (harder picks look more like matches, so it also charges
    hardness, which the margin already prices);
    ``excess``: the probability less the least-squares line of probability on hardness (the composer's S) over
    the batch's picks, i.e. only how much more the model believes a pick matches its anchor than picks of the
    same hardness do: the margin decides how hard, the charge which anchors' hard picks are likely false;
    ``expected``: the pick's worth if the head is right, (1 − p)·margin − ``reward_itm_weight``·p: the hardness pays
    only as far as the head calls the pick a true negative, so a pick it is sure of is worth −weight at any
    hardness (the other two add a charge to a margin that keeps paying for hardness)."""
    reward_mode: Literal["train", "eval"] = "train"
    """``train``: the training forward's loss before, one no-grad train-mode pass after (one extra forward);
    ``eval``: two no-grad eval-mode passes (no dropout noise; two extra forwards)."""
    reward_images: Literal["recompute", "reuse"] = "recompute"
    """L_after's image tokens: ``recompute`` (θ_{k+1}'s image encoder: Algorithm 2 exactly) or ``reuse``
    those of the L_before pass (θ_k): Δ then credits the text and fusion update only, for a reward pass
    without the image encoder (most of its cost: falcon/grit per-step time 1.22 -> 1.08 on albef-tiny, CPU)."""
    reward_baseline: Literal["none", "ema", "batch_mean"] = "none"
    """Subtracted from the reward: ``none`` (the paper), ``ema`` (a moving average of the batch reward) or
    ``batch_mean`` (per-step credit: the mean reward of the batch's other steps)."""
    reward_baseline_decay: float = Field(0.9, ge=0, lt=1)
    """Decay of the ``ema`` reward baseline."""
    scheduler_credit: Literal["batch", "anchor", "chosen", "pair", "levels"] = "batch"
    """Which q a reward credits: ``batch`` (the paper: the batch's Δ for every q), or per step from the
    per-pair decrease Δᵢ (reward: mlm or alignment): ``chosen`` (the q that brought pair i into the batch gets
    Δᵢ), ``anchor`` (the q drawn for anchor i gets Δᵢ), ``pair`` (the mean of both). One more no-grad
    forward per step (L_before per caption). ``levels`` (ours; ``reward: positive_margin`` or
    ``positive_margin+oracle``): not the one q each anchor drew, but every q of a grid of ``scheduler_levels``:
    the composer also finds, at each step, the pick each level would have made for the same anchor among the same
    candidates, the reward scores all of them from the epoch's cached features (and the oracle's verdict), and the
    scheduler moves each anchor's Beta toward the levels that scored above that anchor's mean (no sampled q in
    the gradient, no baseline). ``positive_margin+itm`` cannot: its judge would need a forward of every level's
    pick."""
    scheduler_levels: int = Field(10, ge=2, le=100)
    """``scheduler_credit: levels``: how many q's each anchor is scored at, the centres of equal bins of [0, 1]
    (10: q = 0.05, 0.15, …, 0.95)."""
    scheduler_advantage_norm: bool = False
    """Divide advantages by their running root-mean-square (the scheduler's step no longer scales with Δ)."""
    scheduler_entropy: float = Field(0.0, ge=0)
    """Weight of the Beta's entropy in the scheduler's loss (0: the paper): keeps it from sharpening early."""
    scheduler_max_concentration: float | None = Field(None, gt=0)
    """Cap on α + β (the mean kept); None: no cap (the paper)."""
    scheduler_lag: int = Field(0, ge=0)
    """FALCON batches composed ahead of training: 0 = Algorithm 2 exactly (batch k+1 from the scheduler
    after update k; its items load between steps); L ≥ 1 = batch k+L is composed with the scheduler after
    update k−1 and loads in worker processes while steps compute (see falcon_cli/sampling/feed.py)."""
    scheduler_overlap: bool = False
    """Take one step of ``scheduler_lag`` (which must be ≥ 1) from the scheduler instead of the loader: the update of
    step k is made after step k + 1 is launched, so the device trains step k + 1 while the host reads step k's
    reward, updates the scheduler and composes the next batch (on CUDA on a stream of its own: no wait for the step
    in flight); the loader then composes ``scheduler_lag − 1`` batches ahead. The same batches, updates and losses as
    without it (tested); a step's ``reward``, ``advantage`` and ``concentration`` in metrics.jsonl are then those
    of the update made during it: the previous step's (the epoch's last update is in its ``epoch_summary``)."""

    # -- optimisation ----------------------------------------------------------------------
    epochs: int = Field(3, ge=1)
    """Training epochs (epoch 0 is uniform for every composer)."""
    max_steps_per_epoch: int | None = Field(None, ge=1)
    """Cut each epoch after this many steps (smoke tests); None = the whole epoch: every batch its
    composer makes, so every pair is trained once (unless ``drop_last``)."""
    lr: float = Field(1e-4, gt=0)
    """Peak learning rate (AdamW)."""
    min_lr: float = Field(1e-5, ge=0)
    """Final learning rate of the cosine."""
    warmup_lr: float = Field(1e-5, ge=0)
    """Learning rate at step 0 of the warm-up."""
    warmup_steps: int = Field(2000, ge=0)
    """Linear warm-up length in optimizer steps (the reference: 20 × 100 iterations)."""
    cosine_epochs: int | None = Field(None, ge=1)
    """Epochs the per-epoch cosine spans (GRIT builds it for 30 and trains 20); None = ``epochs``."""
    weight_decay: float = Field(0.02, ge=0)
    """AdamW weight decay (not applied to biases, norms and other 1-D tensors)."""
    grad_clip: float | None = Field(None, gt=0)
    """Clip the global gradient norm to this value; None = no clipping (the reference)."""

    # -- runtime ---------------------------------------------------------------------------
    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """``auto`` = bf16 autocast on GPUs that support it (fp16 + GradScaler otherwise), fp32 on CPU."""
    num_workers: int = Field(2, ge=0)
    """DataLoader worker processes per rank."""
    augment: Literal["pretrain", "test"] = "pretrain"
    """Image transform: ALBEF's pretraining augmentation, or ``test`` (resize only; shapes recipes, whose captions name
    sizes and positions)."""
    hflip: bool = True
    """Random horizontal flips in ``augment: pretrain`` (flips swap "left of" and "right of")."""
    preload_images: bool = False
    """Decode and transform every training image once, before the first step, into one tensor on the
    training device; each batch is then gathered there (no decoding, no host-to-device copy of pixels).
    Bitwise the images of the per-step path. Needs ``augment: test`` (a fixed transform); costs
    images x 3 x resolution² x 4 bytes of device memory (the 10,000-image shapes world at 64 px: 0.5 GB)."""
    compile: bool = False
    """``torch.compile`` the image, text and fusion encoders (each in place: checkpoints keep their
    parameter names). Pays on a GPU for models the size of albef-base; the first steps are slower
    while it compiles."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    """``torch.compile`` mode with ``compile: true``: ``reduce-overhead`` replays CUDA graphs (one graph per
    caption length), for steps bound by the host's kernel launches: albef-base GRIT on an H100 ran 1.8x its
    eager step; ``max-autotune`` also searches matrix-product kernels (long first compile)."""
    graph_step: bool = False
    """Capture the training step whole (experimental until measured on a GPU; docs/speed.md): the forward, every
    loss, ITM mining and MLM in one ``torch.compile(fullgraph=True)`` graph, whose backward AOTAutograd compiles with
    it; on CUDA with ``mode="reduce-overhead"`` (``compile_mode: max-autotune`` keeps its own), so both replay as CUDA
    graphs. For that the step's shapes never change: captions are padded to ``max_text_length``, MLM weights its
    masked positions instead of gathering them, and ITM's sampled negatives use uniforms drawn before the step from
    the run's ITM generator. Not with MAFA (its judge runs on the host in the middle of the step) or ``compile``
    (this compiles the whole step)."""
    graph_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """The compiler of ``graph_step``: ``inductor`` (generated kernels, the fast one), or, to debug a graph on
    any machine, ``aot_eager`` (the same traced forward and backward graphs, run by eager kernels) or ``eager``
    (Dynamo's capture only)."""
    profile_steps: int = Field(0, ge=0)
    """Profile this many training steps with ``torch.profiler`` from the first step of epoch 1 (step 10 of a
    one-epoch run) and write ``profile/trace.json`` and ``profile/summary.txt`` (0 = off)."""
    log_every: int = Field(10, ge=1)
    """Write a metrics.jsonl record every N steps."""
    loggers: Loggers = ["jsonl"]
    """Where the metrics go: ``jsonl`` (``metrics.jsonl``, always written), ``tensorboard``, ``wandb`` (offline
    unless ``WANDB_MODE`` says otherwise), ``mlflow``; each under ``<run>/loggers/<name>/``, each an optional extra
    (``pip install 'falcon-vlp[tensorboard]'``). They get every number of ``metrics.jsonl``, a histogram of the
    q's per epoch (quantile composers) and the figures (docs/monitoring.md)."""
    checkpoint_every: int = Field(0, ge=0)
    """Also checkpoint every N steps (0 = only at the end of each epoch). Under ``torchrun --max-restarts N`` a
    lost node costs at most this many steps (docs/cluster.md)."""
    keep_last: int = Field(3, ge=1)
    """How many checkpoints to keep."""
    preempt_grace_s: float = Field(30.0, gt=0)
    """Seconds between the first SIGTERM, SIGUSR1 or SIGUSR2 and the kill that follows it (SLURM's default is 30 s;
    ``--signal=USR1@120`` gives 120). Every rank finishes its step, the run checkpoints that exact point and exits
    with status 75 (docs/cluster.md); a step and a checkpoint that cannot finish within it exit with one line, the
    previous checkpoint intact. A second signal (over a second after the first) exits at once."""
    dist_timeout: float = Field(600.0, gt=0)
    """Seconds any collective (all-gather, all-reduce, barrier) may wait under torchrun before the run stops with one
    line naming the rank it lost; NCCL's and gloo's own defaults are 10-30 minutes of idle GPUs. Used for the
    whole command (every stage)."""
    eval_split: Literal["val", "test"] | None = "test"
    """Zero-shot ITC retrieval on this retrieval split at the end (None = skip)."""
    eval_every: int = Field(0, ge=0)
    """Also evaluate zero-shot retrieval on ``eval_split`` after every N-th epoch (0 = only at the end): the
    learning curve, in ``metrics.jsonl`` records of kind ``zero_shot`` (R@K in both directions, their mean)."""

    # -- false negatives -------------------------------------------------------------------
    false_negatives: FalseNegativeMethod = "none"
    """How the losses treat likely false negatives (combines with any composer): ``mafa`` (connection
    mining + S-ITC), ``srcl`` (similarity-regulated weights), ``diht`` (HN-NCE), ``glofnd`` (learned
    thresholds); ``none`` = plain ITC. All need ``itc: grit``."""
    mafa: MafaConfig = MafaConfig()
    """MAFA settings."""
    srcl: SrclConfig = SrclConfig()
    """SRCL settings."""
    diht: DihtConfig = DihtConfig()
    """DiHT settings."""
    glofnd: GlofndConfig = GlofndConfig()
    """GloFND settings."""
    same_image: Literal["negative", "mask"] = "negative"
    """Pairs of a batch that show the same image (COCO: five captions per image; entries with the same
    ``image_id``, or else the same image file): ``negative`` treats them as every other in-batch pair, as
    ALBEF, GRIT-VLP and FALCON do, although each is a false negative by construction; ``mask`` removes them
    from the ITC softmax denominators and from ITM negative mining (and from FALCON's ITC/ITM rewards).
    ``mask`` needs ``itc: grit`` and ``false_negatives`` ``none`` or ``glofnd``."""
    oracle_negatives: Literal["keep", "mask", "mask_itc"] = "keep"
    """A diagnostic on a shapes world, not a method: ``mask`` removes every in-batch pair that the world's oracle
    says truly matches (pairs that show the same image included) from the ITC denominators and ITM mining, as
    ``same_image: mask`` does for shared images. It reads the ground truth no real run has, so it measures what the
    false negatives cost a composer: the most any false-negative method could win back. ``mask_itc`` removes them
    from the ITC denominators alone (ITM mines its negatives as usual): the ceiling of a method that changes only
    the ITC (GloFND, SRCL, DiHT). ``keep``: train as usual. Both masks need a shapes world, ``itc: grit`` and
    ``false_negatives: none``."""

    @model_validator(mode="after")
    def _check_false_negatives(self) -> "PretrainConfig":
        framework = self._framework()
        if self.false_negatives != "none" and self.itc != "grit":
            raise ValueError(f"false_negatives={self.false_negatives} works on the in-batch ITC; set itc: grit")
        if self.same_image == "mask" and (self.itc != "grit" or self.false_negatives not in ("none", "glofnd")):
            raise ValueError(
                "same_image=mask works on the in-batch ITC with false_negatives none or glofnd "
                f"(got itc={self.itc}, false_negatives={self.false_negatives}); MAFA, SRCL and DiHT "
                "handle false negatives their own way"
            )
        if self.oracle_negatives != "keep" and (self.itc != "grit" or self.false_negatives != "none"):
            raise ValueError(
                f"oracle_negatives={self.oracle_negatives} works on the in-batch ITC with false_negatives none (got "
                f"itc={self.itc}, false_negatives={self.false_negatives}): it is the bound the "
                "false-negative methods are measured against, not one to combine with them"
            )
        if self.oracle_negatives == "mask_itc" and (self.same_image == "mask" or self.composer == "falcon"):
            raise ValueError(
                "oracle_negatives=mask_itc keeps ITM's mining as it is, and "
                + (
                    "same_image=mask would change it: set one of them (the oracle's ITC mask already holds "
                    "every same-image pair)"
                    if self.same_image == "mask"
                    else "FALCON's reward would measure ITM with the pairs masked: use oracle_negatives=mask "
                    "with composer falcon"
                )
            )
        if self.quantile_scale != "linear" and self.composer in ("uniform", "grit"):
            raise ValueError(
                f"quantile_scale={self.quantile_scale} changes how a drawn q picks: composer {self.composer} "
                "draws none; use it with composer quantile, progressive or falcon"
            )
        if self.false_negatives == "glofnd" and self.glofnd.start_epoch >= self.epochs:
            raise ValueError(
                f"glofnd.start_epoch={self.glofnd.start_epoch} is past the last epoch (epochs={self.epochs}: "
                f"0 to {self.epochs - 1}), so GloFND would never filter; set pretrain.glofnd.start_epoch "
                f"below {self.epochs} (docs/methods.md: start after the same fraction of training as the paper)"
            )
        if self.mafa.low > self.mafa.high:
            raise ValueError(f"mafa.low ({self.mafa.low}) must not exceed mafa.high ({self.mafa.high})")
        if self.graph_step and self.false_negatives == "mafa":
            raise ValueError(
                "graph_step=true cannot capture false_negatives=mafa: MAFA asks its judge, on the host, about "
                "pairs mined in the middle of the step; set graph_step=false"
            )
        if self.scheduler_overlap and self.scheduler_lag < 1:
            raise ValueError(
                "scheduler_overlap=true makes the scheduler's update one step late, which is a "
                "scheduler_lag of at least 1: set scheduler_lag=1 (or more)"
            )
        if self.graph_step and self.compile:
            raise ValueError(
                "graph_step=true compiles the whole step, compile=true the encoders alone: set one of them"
            )
        if self.itc_consistency_weight is None:  # the one place a method's own loss is filled in
            self.itc_consistency_weight = (
                framework.consistency_weight
                if self.false_negatives == "none"
                else ITC_CONSISTENCY_WEIGHT[self.false_negatives]
            )
        if self.reward_baseline == "batch_mean" and self.scheduler_credit == "batch":
            raise ValueError(
                "reward_baseline=batch_mean needs a per-step scheduler_credit (chosen, anchor or pair); "
                "with one reward per batch every advantage would be 0"
            )
        if self.composer == "falcon" and self.reward not in framework.rewards:
            raise ValueError(
                f"reward={self.reward}: {self.model} is a {framework.name} model, whose rewards are "
                f"{', '.join(framework.rewards)}"
                + (
                    " (BLIP-2 has no MLM: its reward is itg)"
                    if self.reward == "mlm"
                    else " (it has no ITM head to judge a pick: positive_margin stands in)"
                    if self.reward.endswith("+itm")
                    else ""
                )
            )
        per_pair = [name for name in PER_PAIR_REWARDS if name in framework.rewards]
        if self.scheduler_credit != "batch" and (self.reward not in per_pair or self.scheduler_level != "instance"):
            raise ValueError(
                f"scheduler_credit={self.scheduler_credit} credits each q with one pair's reward: it needs "
                f"reward: {' or '.join(per_pair)} and scheduler_level: instance "
                f"(got {self.reward}, {self.scheduler_level})"
            )
        if self.reward.startswith("positive_margin") and self.scheduler_credit not in ("chosen", "levels"):
            raise ValueError(
                f"reward={self.reward} scores each pick for the anchor that chose it: it needs "
                f"scheduler_credit: chosen or levels (got {self.scheduler_credit})"
            )
        if self.reward_hardness == "rank" and self.reward not in ("positive_margin+itm", "positive_margin+oracle"):
            raise ValueError(
                f"reward_hardness=rank pays for harder picks until a judge charges them: it needs reward: "
                f"positive_margin+itm or positive_margin+oracle (got {self.reward})"
            )
        if self.scheduler_credit == "levels":
            if self.reward not in ("positive_margin", "positive_margin+oracle"):
                raise ValueError(
                    f"scheduler_credit=levels scores the pick of every level from cached features: it needs "
                    f"reward: positive_margin or positive_margin+oracle (got {self.reward}; the ITM head "
                    "would need a forward of every level's pick)"
                )
            if self.reward_baseline != "none":
                raise ValueError(
                    f"scheduler_credit=levels is its own baseline (each anchor's mean over the levels): "
                    f"set reward_baseline: none (got {self.reward_baseline})"
                )
            if self.reward == "positive_margin+oracle" and self.reward_itm_charge == "excess":
                raise ValueError(
                    "scheduler_credit=levels with reward_itm_charge=excess: the excess is fitted over a "
                    "batch's picks, not a grid's; use reward_itm_charge: expected or absolute"
                )
        if self.composer != "uniform" and self.search_space_size < self.batch_size:
            raise ValueError(
                f"search_space_size ({self.search_space_size}) is smaller than batch_size ({self.batch_size}): "
                f"the {self.composer} composer builds each batch inside one search space; use a "
                f"search_space_size of at least {self.batch_size}"
            )
        if self.min_lr > self.lr or self.warmup_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) and warmup_lr ({self.warmup_lr}) must not exceed lr ({self.lr})")
        if len(set(self.scheduler_features)) != len(self.scheduler_features):
            raise ValueError(f"scheduler_features lists a group twice: {self.scheduler_features}")
        if self.preload_images and self.augment != "test":
            raise ValueError(
                "preload_images=true transforms each image once, so it needs the fixed transform: set "
                "augment: test (or preload_images: false for ALBEF's random augmentation)"
            )
        if self.init is not None and (self.vision_weights or self.text_weights):
            raise ValueError("init loads every weight; leave vision_weights and text_weights unset with it")
        if not framework.frozen_image_encoder and self.vision_trainable_epochs:
            raise ValueError(
                f"vision_trainable_epochs={self.vision_trainable_epochs}: a BLIP-2 setting (its frozen image "
                f"encoder); {self.model} trains its image encoder throughout"
            )
        for key, allowed in framework.fixed_settings:
            if getattr(self, key) != allowed:
                raise ValueError(
                    f"{key}={getattr(self, key)}: not available for {framework.title} models ({self.model}); "
                    f"leave {key} at {allowed}"
                )
        if "unimodal" in (self.vision_weights, self.text_weights) and not framework.unimodal_init:
            raise ValueError(
                f"unimodal weights: the unimodal stage trains ALBEF's encoders (a ViT and a BERT); "
                f"{self.model} is a {framework.title} model"
            )
        if framework.weight_fields["text"] is None and self.text_weights is not None:
            raise ValueError(
                f"text_weights={self.text_weights}: a {framework.title} ({self.model}) loads the whole "
                "open_clip model from vision_weights (a pretrained tag or a file); leave text_weights unset"
            )
        if "caption" in framework.losses:
            uses_caption = self.caption_weight > 0 or (self.composer == "falcon" and "caption" in self.reward)
            if uses_caption and not get_model_config(self.model).has_decoder:
                raise ValueError(
                    f"{self.model} has no captioning decoder (decoder_layers: 0): set caption_weight: 0 "
                    "and a reward without caption (itc, alignment), or use a model config with a decoder"
                )
        return self

    def _framework(self):
        """The :class:`~falcon_cli.frameworks.Framework` of ``model`` (a ValueError naming the valid models if it
        is not registered)."""
        try:
            return model_framework(self.model)
        except FalconError as exc:
            raise ValueError(str(exc)) from None


class UnimodalConfig(Section):
    """The ``unimodal`` stage (shapes worlds): ALBEF's DeiT and BERT in miniature, trained once per world, model
    and seed and cached (``falcon_cli/models/unimodal.py``); pretraining takes them with ``pretrain.vision_weights:
    unimodal`` and ``pretrain.text_weights: unimodal``. The encoders have ``pretrain.model``'s architecture at
    ``pretrain.image_size``."""

    image_epochs: int = Field(30, ge=0)
    """Epochs of the image encoder over the world's training images: per grid cell, classify the shape, the colour
    and the size (or empty), the ImageNet analogue."""
    text_epochs: int = Field(20, ge=0)
    """Epochs of the text encoder over the training captions: masked language modelling, the BERT analogue."""
    extra_images: int = Field(0, ge=0)
    """Scenes drawn afresh from the world's scene distribution (its objects per scene and vocabulary) and rendered
    in memory, added to the world's training images for the image encoder: ImageNet is far larger than COCO, and
    at 32-48 px a ViT learns shapes only from many thousands of images. None of them is in the world."""
    seed: int | None = Field(None, ge=0)
    """The seed of the unimodal encoders (their init, data order, masks and extra scenes); None = the run's
    ``seed``. A sweep that starts every seed of a comparison from the same encoders (as every ALBEF run starts
    from the same DeiT and BERT) sets it, so the encoders are trained once."""
    batch_size: int = Field(64, ge=1)
    """Images or captions per step."""
    image_lr: float = Field(1e-3, gt=0)
    """Peak AdamW learning rate of the image encoder (linear warm-up over the first epoch, cosine to 1% of it)."""
    text_lr: float = Field(5e-4, gt=0)
    """Peak AdamW learning rate of the text encoder (same schedule)."""
    weight_decay: float = Field(0.05, ge=0)
    """AdamW weight decay of both."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm of both to this value (None = no clipping). Without it a ViT at peak ``image_lr``
    can diverge for an epoch and end far worse: the third ``coco-like`` world's encoder (seed 0) jumped from loss
    0.23 to 1.18 in its second epoch and read shape right in 65% of occupied cells instead of ~97%."""
    mlm_probability: float = Field(0.15, gt=0, lt=1)
    """Share of caption tokens masked (BERT's 15%, 80/10/10 as in pretraining's MLM)."""
    cache_dir: Annotated[Path | None, InputPath()] = None
    """Where the weights are kept, one subdirectory per world, architecture, tokenizer, settings and seed; None =
    ``<data.dataset>/unimodal`` (inside the world, so every run of that world shares them)."""
    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""


class EmbedConfig(Section):
    """The ``embed`` stage: embed every pair of a dataset split with a pretrained encoder
    (``embeddings/embeddings.h5``)."""

    encoder: Annotated[str, InputPath(prefixes=("falcon:", "open_clip:local-dir:"))] = "open_clip:ViT-B-32"
    """Which encoder: ``open_clip:<model name>`` (an open_clip architecture, weights from ``pretrained``)
    or ``falcon:<path>`` (a falcon run directory, whose latest checkpoint is used, or one checkpoint
    directory; its projected ITC features)."""

    pretrained: Annotated[str | None, InputPath(when="exists")] = "laion2b_s34b_b79k"
    """open_clip weights: a pretrained tag (``laion2b_s34b_b79k``; downloaded by open_clip, or taken
    from its cache) or a local checkpoint file; None = random weights. Ignored for ``falcon:`` encoders."""

    split: Literal["pretrain", "train", "val", "test"] = "pretrain"
    """Which pairs: ``pretrain`` (the spec's pretraining files, ids = their ``pair_id``), or a
    retrieval split ``train|val|test`` (one pair per caption, ids = the caption's position in the split)."""

    batch_size: int = Field(256, ge=1)
    """Pairs per forward pass."""

    fp16: bool = True
    """Store the embeddings as float16 (half the disk); False stores float32."""

    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``; on CUDA the encoders run under autocast."""

    num_workers: int = Field(2, ge=0)
    """DataLoader worker processes that load and transform images."""

    chunk_size: int = Field(65536, ge=1)
    """Pairs per completed chunk: the unit written to disk and the point ``--resume`` continues from."""


class SearchSpacesConfig(Section):
    """The ``build_search_spaces`` stage: group the pairs into search spaces of |M| (``search_spaces.parquet``)."""

    embeddings: Annotated[Path | None, InputPath()] = None
    """The ``embeddings.h5`` to partition; None = the run directory's ``embeddings/embeddings.h5``
    (what the ``embed`` stage writes). Relative paths are relative to the working directory."""

    method: Literal["random", "kmeans"] = "kmeans"
    """``random``: GRIT-VLP's shuffled spaces; ``kmeans``: balanced spherical k-means on the joint
    (normalised image + text) embedding, so the pairs of a space are semantically close."""

    size: int | None = Field(None, ge=1)
    """Search-space size |M|: pairs per space (the last space holds the remainder); None =
    ``pretrain.search_space_size``, the |M| the batch composers use."""

    seed: int | None = Field(None, ge=0)
    """Seed of the partition (epoch e uses seed + e); None = the recipe's ``seed``."""

    epochs: int = Field(1, ge=1)
    """How many epochs of partitions to write (epochs 0 .. epochs - 1, each drawn afresh)."""

    kmeans_iterations: int = Field(20, ge=1)
    """k-means iterations (``method: kmeans``)."""

    compare: bool = True
    """Also build the other method's epoch-0 partition (not written) and report it beside the
    written one, so the summary shows what k-means changes over random spaces."""


class AuditConfig(Section):
    """The ``audit_false_negatives`` stage: judge the negatives a run used (``audit/``)."""

    judge: Literal["auto", "oracle", "blip", "checkpoint"] = "auto"
    """Who decides that a negative is a false negative: ``oracle`` (the shapes world's ground truth),
    ``blip`` (a BLIP ITM head, as in the paper's Figure 2), ``checkpoint`` (a falcon checkpoint's own
    ITM head); ``auto`` = the oracle where the dataset has one, else BLIP."""

    judge_model: Annotated[str | None, InputPath(when="exists")] = None
    """``blip``: a hub id or local directory (None = ``Salesforce/blip-itm-base-coco``); ``checkpoint``:
    a falcon run or checkpoint directory (None = the audited run's latest checkpoint)."""

    threshold: float = Field(0.5, ge=0.0, le=1.0)
    """A negative is a false negative when the judge's p(match) exceeds this (the paper: 0.5)."""

    negatives: list[Literal["chain", "itm"]] = ["chain", "itm"]
    """Which negatives: ``chain`` (each pair and the anchor it was chosen for, at quantile q) and
    ``itm`` (each anchor's hardest in-batch negative by ITC similarity, the ITM negative), both
    in both directions (image→text, text→image)."""

    max_pairs: int | None = Field(20000, ge=1)
    """Judge at most this many (anchor, negative) pairs: whole training steps, evenly spread over
    training; None = every step."""

    steps: int | None = Field(None, ge=1)
    """Audit at most this many training steps, evenly spread (with ``max_pairs``, the tighter wins)."""

    hardness_buckets: int = Field(5, ge=1)
    """Equal-width buckets of hardness (q) in [0, 1] for the false-negative rate table."""

    step_windows: int = Field(4, ge=1)
    """Equal ranges of audited training steps for the false-negative rate table."""

    filter_thresholds: list[Annotated[float, Field(ge=0, le=1)]] = [
        0.1,
        0.2,
        0.3,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        0.95,
        0.99,
    ]
    """Thresholds τ of the filter curve: negatives with judge score > τ are dropped, and the
    false-negative ratio of the rest is measured (by the oracle where there is one)."""

    examples: int = Field(12, ge=0)
    """How many missed false negatives (oracle: a match; judge: low score) ``missed_examples.png`` shows."""

    batch_size: int = Field(64, ge=1)
    """Pairs per forward pass of a model judge."""

    device: str = "auto"
    """Where a model judge runs: ``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""

    fp16: bool = False
    """Run a model judge in fp16 autocast (CUDA only)."""

    @model_validator(mode="after")
    def _check(self) -> "AuditConfig":
        if not self.negatives or len(set(self.negatives)) != len(self.negatives):
            raise ValueError(f"negatives must name chain and/or itm once each, got {self.negatives}")
        return self


class TaskTraining(Section):
    """Optimisation of one fine-tuning task (AdamW; linear warm-up, then a per-epoch cosine)."""

    epochs: int = Field(5, ge=0)
    """Training epochs (0 = skip training: the starting weights become the task's checkpoint)."""
    lr: float = Field(1e-5, gt=0)
    """Peak learning rate."""
    min_lr: float = Field(1e-6, ge=0)
    """Learning rate the per-epoch cosine ends at."""
    warmup_lr: float = Field(1e-5, ge=0)
    """Learning rate at step 0 of the warm-up."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up length in optimizer steps."""
    weight_decay: float = Field(0.02, ge=0)
    """AdamW weight decay (not on biases and norms)."""
    batch_size: int = Field(32, ge=1)
    """Batch size PER PROCESS."""
    image_size: int | None = Field(384, ge=8)
    """Fine-tuning resolution (ViT position embeddings are resampled); None = the pretrained model's."""
    max_steps_per_epoch: int | None = Field(None, ge=1)
    """Cut each epoch after this many steps (smoke tests); None = the whole epoch: every batch its
    composer makes, so every pair is trained once (unless ``drop_last``)."""


class RetrievalFinetuneConfig(TaskTraining):
    """Retrieval fine-tuning (ALBEF): ITC against a momentum queue whose captions of the same image
    are all positives, plus ITM with sampled hard negatives (same-image pairs never negatives)."""

    queue_size: int = Field(65536, ge=1)
    """Momentum feature queue length; a multiple of the global batch (the last partial batch is dropped)."""
    momentum: float = Field(0.995, ge=0, lt=1)
    """EMA momentum of the momentum encoders."""
    distill_alpha: float = Field(0.0, ge=0, le=1)
    """Momentum-distillation weight (ALBEF 0.4; GRIT-VLP and MAFA fine-tune without it: 0)."""
    select_split: Literal["val", "test"] = "val"
    """The split whose mean recall picks the best epoch (ALBEF: val; GRIT and MAFA used test)."""
    select_k: int | None = Field(256, ge=1)
    """ITM re-ranking depth of the per-epoch selection score; None = ITC similarity only (faster)."""

    @model_validator(mode="after")
    def _queue_holds_whole_batches(self) -> "RetrievalFinetuneConfig":
        if self.queue_size % self.batch_size:
            raise ValueError(
                f"queue_size {self.queue_size} is not a multiple of batch_size {self.batch_size} "
                "(the queue takes whole global batches)"
            )
        return self


class VqaFinetuneConfig(TaskTraining):
    """VQA fine-tuning (ALBEF): the answer decoder starts from the fusion layers; the loss is each
    question's answers' sequence cross-entropy, weighted by how many annotators gave them."""

    epochs: int = Field(8, ge=0)
    """Training epochs."""
    lr: float = Field(2e-5, gt=0)
    """Peak learning rate."""
    warmup_steps: int = Field(400, ge=0)
    """Warm-up steps (ALBEF: 4 × 100 iterations from 1e-5)."""
    train_splits: list[Literal["train", "val"]] = ["train", "val"]
    """VQA splits trained on (VQA v2 trains on train + val; add Visual Genome QA files to the spec's train list)."""
    max_answer_length: int = Field(10, ge=2)
    """Token limit of an answer, [CLS] and [SEP] included."""


class Nlvr2FinetuneConfig(TaskTraining):
    """NLVR2 (ALBEF): text-assignment pretraining on the run's image-text pairs (the fusion layers
    duplicated per image), then fine-tuning of the two-way classifier."""

    epochs: int = Field(10, ge=0)
    """Fine-tuning epochs on NLVR2 train (best by dev accuracy)."""
    lr: float = Field(2e-5, gt=0)
    """Peak learning rate."""
    warmup_steps: int = Field(100, ge=0)
    """Warm-up steps (ALBEF: one 100-iteration warm-up epoch)."""
    batch_size: int = Field(16, ge=1)
    """Batch size PER PROCESS (image pairs)."""
    ta_epochs: int = Field(1, ge=0)
    """Text-assignment pretraining epochs over the pretraining pairs (0 = skip)."""
    ta_lr: float = Field(2e-5, gt=0)
    """Text-assignment learning rate (constant after warm-up, per-epoch cosine otherwise)."""
    ta_batch_size: int = Field(64, ge=2)
    """Text-assignment batch size PER PROCESS (hard images are drawn from the batch)."""
    ta_image_size: int | None = Field(256, ge=8)
    """Text-assignment resolution; None = the pretrained model's."""
    ta_max_steps: int | None = Field(None, ge=1)
    """Cut text-assignment pretraining after this many steps; None = all ``ta_epochs``."""


class FinetuneConfig(Section):
    """The ``finetune`` stage: ALBEF's downstream fine-tuning, one task after another (``finetune/<task>/``)."""

    tasks: list[TaskName] = ["retrieval"]
    """Which tasks to fine-tune, in this order."""
    checkpoint: Annotated[str | None, InputPath()] = None
    """The pretrained weights to start from: a falcon run or checkpoint directory, or an official
    ALBEF / GRIT-VLP / MAFA ``.pth`` file (its architecture read from its shapes; the run's tokenizer
    must have its vocabulary); None = this run's latest pretraining checkpoint."""
    retrieval: RetrievalFinetuneConfig = RetrievalFinetuneConfig()
    """Retrieval fine-tuning (COCO: 5 epochs; Flickr30k: 10)."""
    vqa: VqaFinetuneConfig = VqaFinetuneConfig()
    """VQA fine-tuning."""
    nlvr2: Nlvr2FinetuneConfig = Nlvr2FinetuneConfig()
    """NLVR2 text-assignment pretraining and fine-tuning."""
    max_text_length: int = Field(30, ge=2)
    """Token limit of captions, questions and statements."""
    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """``auto`` = bf16 autocast on GPUs that support it (fp16 + GradScaler otherwise), fp32 on CPU."""
    num_workers: int = Field(2, ge=0)
    """DataLoader worker processes per rank."""
    augment: bool = True
    """ALBEF's fine-tuning augmentation (random crops of scale 0.5-1, flips, RandAugment); False =
    resize only (the shapes world, whose captions name positions and sizes)."""
    log_every: int = Field(10, ge=1)
    """Write a ``finetune/<task>/metrics.jsonl`` record every N steps."""
    preempt_grace_s: float = Field(30.0, gt=0)
    """As ``pretrain.preempt_grace_s``: on SIGTERM, SIGUSR1 or SIGUSR2 every rank finishes its step, the task
    checkpoints that exact point and the command exits with status 75 (``--resume`` continues from it)."""
    loggers: Loggers = ["jsonl"]
    """Where the metrics go, as ``pretrain.loggers``: ``jsonl`` (always written), ``tensorboard``, ``wandb``,
    ``mlflow``, each task's under ``finetune/<task>/loggers/<name>/`` (docs/monitoring.md)."""

    @model_validator(mode="after")
    def _check(self) -> "FinetuneConfig":
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must be distinct, got {self.tasks}")
        if not set(self.vqa.train_splits) or len(set(self.vqa.train_splits)) != len(self.vqa.train_splits):
            raise ValueError(f"vqa.train_splits must name train and/or val once each, got {self.vqa.train_splits}")
        return self


class RetrievalEvalConfig(Section):
    """Retrieval evaluation (ALBEF's and BLIP-2's protocol): ITC similarity of all pairs, the top k re-ranked by the ITM
    head."""

    models: Annotated[list[str], InputPath(keywords=("pretrained", "finetuned"))] = ["pretrained"]
    """Which weights to evaluate, one row each: ``pretrained`` (the run's latest pretraining checkpoint:
    zero-shot, FALCON's protocol), ``finetuned`` (``finetune/retrieval/best``: MAFA's and SRCL's protocol),
    a checkpoint directory, or an official ALBEF / GRIT-VLP / MAFA ``.pth`` file."""
    split: Literal["pretrain", "val", "test"] = "test"
    """The retrieval split; ``pretrain``: the pretraining pairs the run trained on, one item per image with every
    caption it is paired with (at most ``pretrain_images`` images), scored as a split: beside ``test``, how much of
    what the model ranks well it only memorised. Its results go to ``results/retrieval_pretrain.*`` (and
    ``near_misses_pretrain.*``), so the test split's stay."""
    pretrain_images: int | None = Field(5000, ge=1)
    """With ``split: pretrain``: at most this many of the pretraining images, drawn at random (seed 0, the same for
    every run of a dataset), as a 5K test split has; None = all of them."""
    k: int = Field(256, ge=1)
    """Re-ranking depth: the ITC top k of each query are re-scored with the ITM match logit (COCO 5K:
    256, Flickr30k 1K: 128)."""
    rerank_score: Literal["auto", "itm", "itm+itc"] = "auto"
    """What re-scores the top k: ``itm`` (ALBEF's rule: the ITM match logit alone), ``itm+itc`` (LAVIS's
    rule for BLIP-2: the match logit plus the ITC cosine); ``auto`` = the model framework's own rule (a dual
    encoder has no ITM head: it ranks by its embedding similarity alone, and ``k`` does not apply)."""
    itc_only: bool = False
    """Rank by ITC similarity only (fast; no re-ranking)."""
    also_itc: bool = True
    """With re-ranking, also report each model's ITC-only ranking (one more row; the same embeddings)."""
    false_negatives: Literal["auto", "oracle", "eccv", "none"] = "auto"
    """False-negative-aware metrics: ``oracle`` (the shapes world's compatibility: every truly matching
    item is a positive), ``eccv`` (ECCV Caption, CxC and COCO 1K/5K through the ``eccv_caption`` package;
    COCO 5K test, needs COCO ids: ``coco_captions`` or entries with ``image_id`` and ``caption_ids``),
    ``none``; ``auto`` = the oracle where the dataset has one, else ECCV where it can be computed, else
    none with the reason printed and recorded in the results' ``meta.false_negatives_skipped``."""
    coco_captions: Annotated[Path | None, InputPath()] = None
    """COCO's ``annotations/captions_val2014.json`` (relative paths are relative to the working
    directory): maps the split's images and captions to COCO image and caption ids for ``eccv``, by
    image file name and caption text (whitespace, case and trailing periods ignored). Needed for ALBEF's
    ``coco_karpathy_test.json``, whose entries carry no ids; when set it is used even if they do. The
    match counts go to the results' ``meta.coco_ids``; anything unmatched means no ECCV metrics."""
    top_k_lists: int = Field(50, ge=10)
    """Length of the ranked lists handed to ``eccv_caption`` (at least the largest R: 48)."""


class VqaEvalConfig(Section):
    """VQA evaluation: rank the candidate answer list with the fine-tuned decoder."""

    split: Literal["val", "test"] = "test"
    """The VQA split answered; with answers in the file, the local VQA accuracy is reported too."""
    k: int = Field(128, ge=1)
    """Candidates kept by first-token probability, then re-scored by full-sequence likelihood."""
    checkpoint: Annotated[str | None, InputPath()] = None
    """The fine-tuned VQA weights (a checkpoint directory); None = this run's ``finetune/vqa/best``."""
    answer_processing: Literal["official", "normalized"] = "official"
    """How the local accuracy matches a prediction against the human answers. ``official``: as the
    official ``vqaEval.py`` and the evaluation server (the prediction is fully normalised; the human
    answers only lose punctuation, and only when they are not all identical), comparable with published
    numbers. ``normalized``: the human answers are fully normalised too (case, number words, articles,
    contractions), a more forgiving score."""


class Nlvr2EvalConfig(Section):
    """NLVR2 evaluation: accuracy of the fine-tuned classifier."""

    splits: list[Literal["dev", "test"]] = ["dev", "test"]
    """The NLVR2 splits reported (``test`` = test-P)."""
    checkpoint: Annotated[str | None, InputPath()] = None
    """The fine-tuned NLVR2 weights (a checkpoint directory); None = this run's ``finetune/nlvr2/best``."""


class EvaluateConfig(Section):
    """The ``evaluate`` stage: downstream results into ``results/`` (``retrieval``, ``vqa``, ``nlvr2``)."""

    tasks: list[TaskName] = ["retrieval"]
    """Which evaluations to run, in this order (``vqa`` and ``nlvr2`` need the fine-tuned checkpoints)."""
    retrieval: RetrievalEvalConfig = RetrievalEvalConfig()
    """Retrieval."""
    vqa: VqaEvalConfig = VqaEvalConfig()
    """VQA."""
    nlvr2: Nlvr2EvalConfig = Nlvr2EvalConfig()
    """NLVR2."""
    image_size: int | None = Field(None, ge=8)
    """Evaluation resolution; None = each checkpoint's own."""
    max_text_length: int | None = Field(None, ge=2)
    """Token limit of captions, questions and statements; None = the limit each evaluated checkpoint was
    trained with (its ``meta.json``, else its run's config: the pretraining zero-shot numbers and these
    then agree), 30 for checkpoints that do not say (official ``.pth`` files: ALBEF's). Recorded per row
    in the results."""
    batch_size: int = Field(64, ge=1)
    """Images or texts per encoder forward, and pairs per ITM re-ranking forward."""
    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """``auto`` = bf16 autocast on GPUs that support it (fp16 elsewhere on CUDA), fp32 on CPU."""
    num_workers: int = Field(2, ge=0)
    """DataLoader worker processes."""

    @model_validator(mode="after")
    def _check(self) -> "EvaluateConfig":
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must be distinct, got {self.tasks}")
        if not self.retrieval.models:
            raise ValueError("retrieval.models must name at least one model (pretrained, finetuned or a checkpoint)")
        if not self.nlvr2.splits:
            raise ValueError("nlvr2.splits must name dev and/or test")
        return self


class Recipe(Section):
    """A recipe: which stages to run, in order, and one config section per stage."""

    name: str = "recipe"
    """The recipe's name (defaults to the file stem); the default run directory is ``runs/<name>``."""

    description: str = ""
    """One line saying what this recipe is for (shown by ``falcon recipes list``)."""

    seed: int = Field(0, ge=0)
    """Global seed; each distributed rank uses ``seed + rank``."""

    stages: list[StageName] = ["data"]
    """Stages that ``falcon run`` executes, in order."""

    data: DataConfig
    """The ``data`` stage: dataset spec, optional shapes-world generation, check and tokenizer."""

    unimodal: UnimodalConfig = UnimodalConfig()
    """The ``unimodal`` stage: the image and text encoders' starting points on a shapes world."""

    embed: EmbedConfig = EmbedConfig()
    """The ``embed`` stage."""

    search_spaces: SearchSpacesConfig = SearchSpacesConfig()
    """The ``build_search_spaces`` stage."""

    pretrain: PretrainConfig = PretrainConfig()
    """The ``pretrain`` stage."""

    audit: AuditConfig = AuditConfig()
    """The ``audit_false_negatives`` stage."""

    finetune: FinetuneConfig = FinetuneConfig()
    """The ``finetune`` stage: retrieval, VQA and NLVR2 fine-tuning."""

    evaluate: EvaluateConfig = EvaluateConfig()
    """The ``evaluate`` stage: retrieval (with false-negative-aware metrics), VQA and NLVR2 results."""

    @model_validator(mode="after")
    def _stages_in_order(self) -> "Recipe":
        order = [STAGE_ORDER.index(s) for s in self.stages]
        if order != sorted(order) or len(set(order)) != len(order):
            raise ValueError(f"stages must be distinct and in pipeline order {list(STAGE_ORDER)}, got {self.stages}")
        return self
