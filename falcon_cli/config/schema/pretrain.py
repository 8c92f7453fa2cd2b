"""The ``pretrain`` stage's section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Loggers, Section
from falcon_cli.config.schema.false_negatives import (
    DihtConfig,
    FalseNegativeMethod,
    GlofndConfig,
    MafaConfig,
    SrclConfig,
)
from falcon_cli.errors import FalconError
from falcon_cli.frameworks import model_framework
from falcon_cli.method_weights import ITC_CONSISTENCY_WEIGHT
from falcon_cli.models.registry import get_model_config

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
    def _check_false_negative_methods(self) -> "PretrainConfig":
        """Each false-negative method, and the oracle's masks, on the ITC they work on."""
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
        if self.false_negatives == "glofnd" and self.glofnd.start_epoch >= self.epochs:
            raise ValueError(
                f"glofnd.start_epoch={self.glofnd.start_epoch} is past the last epoch (epochs={self.epochs}: "
                f"0 to {self.epochs - 1}), so GloFND would never filter; set pretrain.glofnd.start_epoch "
                f"below {self.epochs} (docs/methods.md: start after the same fraction of training as the paper)"
            )
        if self.mafa.low > self.mafa.high:
            raise ValueError(f"mafa.low ({self.mafa.low}) must not exceed mafa.high ({self.mafa.high})")
        return self

    @model_validator(mode="after")
    def _fill_itc_consistency_weight(self) -> "PretrainConfig":
        """The one place a method's own ITC consistency weight is filled in (its paper's)."""
        framework = self._framework()
        if self.itc_consistency_weight is None:  # the one place a method's own loss is filled in
            self.itc_consistency_weight = (
                framework.consistency_weight
                if self.false_negatives == "none"
                else ITC_CONSISTENCY_WEIGHT[self.false_negatives]
            )
        return self

    @model_validator(mode="after")
    def _check_composer(self) -> "PretrainConfig":
        """The composer's settings: a q scale where a q is drawn, search spaces that hold a batch."""
        if self.quantile_scale != "linear" and self.composer in ("uniform", "grit"):
            raise ValueError(
                f"quantile_scale={self.quantile_scale} changes how a drawn q picks: composer {self.composer} "
                "draws none; use it with composer quantile, progressive or falcon"
            )
        if self.composer != "uniform" and self.search_space_size < self.batch_size:
            raise ValueError(
                f"search_space_size ({self.search_space_size}) is smaller than batch_size ({self.batch_size}): "
                f"the {self.composer} composer builds each batch inside one search space; use a "
                f"search_space_size of at least {self.batch_size}"
            )
        return self

    @model_validator(mode="after")
    def _check_scheduler_and_reward(self) -> "PretrainConfig":
        """FALCON's scheduler and its reward: each credit with the rewards it can use."""
        framework = self._framework()
        if self.scheduler_overlap and self.scheduler_lag < 1:
            raise ValueError(
                "scheduler_overlap=true makes the scheduler's update one step late, which is a "
                "scheduler_lag of at least 1: set scheduler_lag=1 (or more)"
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
        if len(set(self.scheduler_features)) != len(self.scheduler_features):
            raise ValueError(f"scheduler_features lists a group twice: {self.scheduler_features}")
        return self

    @model_validator(mode="after")
    def _check_step_capture(self) -> "PretrainConfig":
        """What a captured step (graph_step) can hold, and one compiler at a time."""
        if self.graph_step and self.false_negatives == "mafa":
            raise ValueError(
                "graph_step=true cannot capture false_negatives=mafa: MAFA asks its judge, on the host, about "
                "pairs mined in the middle of the step; set graph_step=false"
            )
        if self.graph_step and self.compile:
            raise ValueError(
                "graph_step=true compiles the whole step, compile=true the encoders alone: set one of them"
            )
        return self

    @model_validator(mode="after")
    def _check_schedule(self) -> "PretrainConfig":
        """The learning-rate schedule: its start and end do not exceed the peak."""
        if self.min_lr > self.lr or self.warmup_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) and warmup_lr ({self.warmup_lr}) must not exceed lr ({self.lr})")
        return self

    @model_validator(mode="after")
    def _check_weights_and_images(self) -> "PretrainConfig":
        """Where the weights come from, and preloaded images with the fixed transform."""
        if self.preload_images and self.augment != "test":
            raise ValueError(
                "preload_images=true transforms each image once, so it needs the fixed transform: set "
                "augment: test (or preload_images: false for ALBEF's random augmentation)"
            )
        if self.init is not None and (self.vision_weights or self.text_weights):
            raise ValueError("init loads every weight; leave vision_weights and text_weights unset with it")
        return self

    @model_validator(mode="after")
    def _check_framework_settings(self) -> "PretrainConfig":
        """What the model's framework (ALBEF, BLIP-2, dual encoder) allows."""
        framework = self._framework()
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
