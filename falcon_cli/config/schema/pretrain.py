"""The ``pretrain`` stage's section, in typed sections: ``encoders``, ``losses``, ``composer``, ``scheduler``,
``false_negatives``, ``optim``, ``loader``, ``runtime``, ``logging``, ``checkpoints`` and ``eval``. Each section
checks its own fields; :class:`PretrainConfig` checks what spans sections (a method on the ITC it needs, a
reward the model's framework has). Keys renamed in 0.3.0 are read under their new names
(:mod:`falcon_cli.artifacts.renamed_keys`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from falcon_cli.artifacts.renamed_keys import upgrade_mapping
from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Loggers, Section
from falcon_cli.config.schema.false_negatives import NO_METHOD, FalseNegativesConfig
from falcon_cli.config.schema.scheduler import SchedulerConfig
from falcon_cli.errors import FalconError
from falcon_cli.frameworks import model_framework
from falcon_cli.models.registry import get_model_config
from falcon_cli.registry import COMPOSERS, FALSE_NEGATIVE_METHODS, unknown_name_message


def _registered_composer(name: str) -> str:
    if name not in COMPOSERS:
        raise ValueError(unknown_name_message("composer", name, COMPOSERS.names()))
    return name


ComposerName = Annotated[str, AfterValidator(_registered_composer)]
"""``pretrain.composer.name``: a registered composer's name (:data:`falcon_cli.registry.COMPOSERS`)."""


class EncodersConfig(Section):
    """``pretrain.encoders``: where the encoders' weights come from, and the sizes of their inputs."""

    image_size: int | None = Field(None, ge=8)
    """Input resolution in pixels (default: the model config's; albef-base pretrains at 256)."""
    max_text_length: int = Field(25, ge=2)
    """Token limit of captions (the reference uses 25)."""
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
    ``encoders.image_size``; its momentum copies and queues are skipped. ``model`` must have the checkpoint's
    architecture (``albef-base`` for the released ones) and the run's tokenizer its vocabulary
    (``data.tokenizer: bert-base-uncased``). None = ``encoders.vision_weights``/``encoders.text_weights`` or random
    init."""

    @model_validator(mode="after")
    def _check_weights(self) -> "EncodersConfig":
        """One source of weights: a whole checkpoint, or one per encoder."""
        if self.init is not None and (self.vision_weights or self.text_weights):
            raise ValueError("init loads every weight; leave vision_weights and text_weights unset with it")
        return self


class LossesConfig(Section):
    """``pretrain.losses``: the pretraining losses' variants and weights (ITC, ITM, MLM; a dual encoder's
    captioning)."""

    itc: Literal["grit", "momentum"] = "grit"
    """ITC variant: ``grit`` (in-batch, soft pseudo targets, FALCON's default) or ``momentum`` (ALBEF's
    distillation)."""
    itc_consistency_weight: float | None = Field(None, ge=0.0)
    """Weight of GRIT-VLP's ITC consistency (soft pseudo target) term. None (the default) = the
    method's own (``false_negatives.method``): 0.2 for ``none`` (GRIT-VLP, FALCON), 0 for ``mafa``, ``srcl``,
    ``diht`` and ``glofnd``, whose papers do not train it. Resolved when the config is validated,
    so the run's config.yaml, its manifest and ``falcon recipes show`` hold the number trained."""
    momentum: float = Field(0.995, ge=0, lt=1)
    """EMA momentum of the momentum encoders (``losses.itc: momentum``)."""
    queue_size: int = Field(65536, ge=1)
    """Feature-queue length (``losses.itc: momentum``); must be a multiple of the global batch."""
    distill_alpha: float = Field(0.4, ge=0, le=1)
    """Distillation weight α, ramped linearly over epoch 0 (``losses.itc: momentum``)."""
    caption_weight: float = Field(1.0, ge=0)
    """Dual encoders: weight of the captioning decoder's loss beside the contrastive loss (SigLIP 2: 1; CoCa: 2);
    0 with a model without a decoder."""
    itm_negatives: Literal["hardest", "sample"] = "hardest"
    """ITM negatives: the hardest in-batch negative per anchor (GRIT/FALCON) or ALBEF's multinomial sampling."""
    mlm_probability: float = Field(0.5, gt=0, le=1)
    """MLM masking probability (0.5 in GRIT/FALCON, 0.15 in ALBEF)."""


class ComposerConfig(Section):
    """``pretrain.composer``: how mini-batches are composed, and the search spaces they are composed in."""

    name: ComposerName = "grit"
    """How mini-batches are composed: ``uniform`` random; ``grit`` (GRIT-VLP's hardest-negative chain);
    ``quantile`` (FALCON's Algorithm 1 with a fixed q); ``progressive`` (q moving linearly over the
    epochs); ``falcon`` (q from the learned scheduler); or a plugin's (docs/extending.md). Epoch 0 is uniform for
    all of them."""
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
    quantile: float = Field(1.0, ge=0, le=1)
    """q of ``composer.name: quantile`` (1 = the most similar remaining pair, 0.5 = the median, 0 = the least
    similar)."""
    progressive_start: float = Field(0.0, ge=0, le=1)
    """q of ``composer.name: progressive`` at epoch 1 (hardening: 0 -> 1; softening: set 1 and
    ``composer.progressive_end: 0``)."""
    progressive_end: float = Field(1.0, ge=0, le=1)
    """q of ``composer.name: progressive`` at the last epoch (linear in between)."""
    quantile_scale: Literal["linear", "log_rank", "quadratic_rank"] = "linear"
    """How a quantile composer's q picks among a step's n candidates (every composer that draws q: fixed,
    progressive, FALCON): ``linear``, the paper's, the q-quantile of their similarities (q = 0.94 of 500 is the 31st
    most similar); ``log_rank``, the k-th most similar with k = round(n^(1 - q)) (q = 1 the most similar, q = 0 the
    least; q = 0.94 of 500 the most similar, q = 0.9 the 2nd), so that a Beta over q can put real mass on the top
    few candidates, where GRIT's picks are (docs/results.md: FALCON in the testbed, five paired seeds);
    ``quadratic_rank``, between the two, the k-th most similar with k − 1 = round((n − 1)(1 − q)²) (of 500, q = 0.98
    the most similar, q = 0.9 the 6th, q = 0.5 the 126th), so that the middle of the list keeps a real share of q too
    (where false negatives are dense, log-rank puts every safe pick below q 0.05: docs/results.md, issue 70)."""

    @model_validator(mode="after")
    def _check_scale(self) -> "ComposerConfig":
        """A q scale only where a q is drawn."""
        if self.quantile_scale != "linear" and not COMPOSERS.get(self.name).draws_q:
            raise ValueError(
                f"quantile_scale={self.quantile_scale} changes how a drawn q picks: composer {self.name} "
                "draws none; use it with composer quantile, progressive or falcon"
            )
        return self


class OptimizerConfig(Section):
    """``pretrain.optim``: the VLP model's AdamW and its learning-rate schedule (warm-up, then a per-epoch cosine)."""

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

    @model_validator(mode="after")
    def _check_schedule(self) -> "OptimizerConfig":
        """The learning-rate schedule: its start and end do not exceed the peak."""
        if self.min_lr > self.lr or self.warmup_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) and warmup_lr ({self.warmup_lr}) must not exceed lr ({self.lr})")
        return self


class LoaderConfig(Section):
    """``pretrain.loader``: how training images are read and transformed."""

    num_workers: int = Field(2, ge=0)
    """DataLoader worker processes per rank."""
    augment: Literal["pretrain", "test"] = "pretrain"
    """Image transform: ALBEF's pretraining augmentation, or ``test`` (resize only; shapes recipes, whose captions name
    sizes and positions)."""
    hflip: bool = True
    """Random horizontal flips in ``loader.augment: pretrain`` (flips swap "left of" and "right of")."""
    preload_images: bool = False
    """Decode and transform every training image once, before the first step, into one tensor on the
    training device; each batch is then gathered there (no decoding, no host-to-device copy of pixels).
    Bitwise the images of the per-step path. Needs ``loader.augment: test`` (a fixed transform); costs
    images x 3 x resolution² x 4 bytes of device memory (the 10,000-image shapes world at 64 px: 0.5 GB)."""

    @model_validator(mode="after")
    def _check_preload(self) -> "LoaderConfig":
        """Preloaded images need the fixed transform."""
        if self.preload_images and self.augment != "test":
            raise ValueError(
                "preload_images=true transforms each image once, so it needs the fixed transform: set "
                "augment: test (or preload_images: false for ALBEF's random augmentation)"
            )
        return self


class RuntimeConfig(Section):
    """``pretrain.runtime``: the device, the precision, compilation, profiling, and the limits of a distributed run."""

    device: str = "auto"
    """``auto`` (the local GPU if any, else CPU), ``cpu`` or ``cuda[:n]``."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """``auto`` = bf16 autocast on GPUs that support it (fp16 + GradScaler otherwise), fp32 on CPU. ``bf16`` on a CPU
    with native bf16 matrix units (AVX512-BF16 or AMX, as on Intel's Sapphire Rapids and AMD's Zen 4 and later)
    trains albef-tiny about 1.5x faster than fp32 (benchmarks/cpu_precision.py); a CPU without them refuses it."""
    compile: bool = False
    """``torch.compile`` the image, text and fusion encoders (each in place: checkpoints keep their
    parameter names). Pays on a GPU for models the size of albef-base; the first steps are slower
    while it compiles."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    """``torch.compile`` mode with ``runtime.compile: true``: ``reduce-overhead`` replays CUDA graphs (one graph per
    caption length), for steps bound by the host's kernel launches: albef-base GRIT on an H100 ran 1.8x its
    eager step; ``max-autotune`` also searches matrix-product kernels (long first compile)."""
    graph_step: bool = False
    """Capture the training step whole (experimental until measured on a GPU; docs/speed.md): the forward, every
    loss, ITM mining and MLM in one ``torch.compile(fullgraph=True)`` graph, whose backward AOTAutograd compiles with
    it; on CUDA with ``mode="reduce-overhead"`` (``runtime.compile_mode: max-autotune`` keeps its own), so both replay
    as CUDA graphs. For that the step's shapes never change: captions are padded to ``encoders.max_text_length``, MLM
    weights its masked positions instead of gathering them, and ITM's sampled negatives use uniforms drawn before the
    step from the run's ITM generator. Not with MAFA (its judge runs on the host in the middle of the step) or
    ``compile`` (this compiles the whole step)."""
    graph_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """The compiler of ``runtime.graph_step``: ``inductor`` (generated kernels, the fast one), or, to debug a graph on
    any machine, ``aot_eager`` (the same traced forward and backward graphs, run by eager kernels) or ``eager``
    (Dynamo's capture only)."""
    profile_steps: int = Field(0, ge=0)
    """Profile this many training steps with ``torch.profiler`` from the first step of epoch 1 (step 10 of a
    one-epoch run) and write ``profile/trace.json`` and ``profile/summary.txt`` (0 = off)."""
    dist_timeout: float = Field(600.0, gt=0)
    """Seconds any collective (all-gather, all-reduce, barrier) may wait under torchrun before the run stops with one
    line naming the rank it lost; NCCL's and gloo's own defaults are 10-30 minutes of idle GPUs. Used for the
    whole command (every stage)."""
    preempt_grace_s: float = Field(30.0, gt=0)
    """Seconds between the first SIGTERM, SIGUSR1 or SIGUSR2 and the kill that follows it (SLURM's default is 30 s;
    ``--signal=USR1@120`` gives 120). Every rank finishes its step, the run checkpoints that exact point and exits
    with status 75 (docs/cluster.md); a step and a checkpoint that cannot finish within it exit with one line, the
    previous checkpoint intact. A second signal (over a second after the first) exits at once."""

    @model_validator(mode="after")
    def _check_compilers(self) -> "RuntimeConfig":
        """One compiler at a time."""
        if self.graph_step and self.compile:
            raise ValueError(
                "graph_step=true compiles the whole step, compile=true the encoders alone: set one of them"
            )
        return self


class LoggingConfig(Section):
    """``pretrain.logging``: how often metrics are written, and where they go."""

    every: int = Field(10, ge=1)
    """Write a metrics.jsonl record every N steps."""
    loggers: Loggers = ["jsonl"]
    """Where the metrics go: ``jsonl`` (``metrics.jsonl``, always written), ``tensorboard``, ``wandb`` (offline
    unless ``WANDB_MODE`` says otherwise), ``mlflow``; each under ``<run>/loggers/<name>/``, each an optional extra
    (``pip install 'falcon-vlp[tensorboard]'``). They get every number of ``metrics.jsonl``, a histogram of the
    q's per epoch (quantile composers) and the figures (docs/monitoring.md)."""


class CheckpointsConfig(Section):
    """``pretrain.checkpoints``: how often a checkpoint is written, and how many are kept."""

    every: int = Field(0, ge=0)
    """Also checkpoint every N steps (0 = only at the end of each epoch). Under ``torchrun --max-restarts N`` a
    lost node costs at most this many steps (docs/cluster.md)."""
    keep_last: int = Field(3, ge=1)
    """How many checkpoints to keep."""


class PretrainEvalConfig(Section):
    """``pretrain.eval``: zero-shot retrieval during and after pretraining."""

    split: Literal["val", "test"] | None = "test"
    """Zero-shot ITC retrieval on this retrieval split at the end (None = skip)."""
    every: int = Field(0, ge=0)
    """Also evaluate zero-shot retrieval on ``eval.split`` after every N-th epoch (0 = only at the end): the
    learning curve, in ``metrics.jsonl`` records of kind ``zero_shot`` (R@K in both directions, their mean)."""


class PretrainConfig(Section):
    """ALBEF pretraining: the model and its schedule at the top, every other setting in its section."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """Keys renamed in 0.3.0 (``PretrainConfig(scheduler_lr=...)``, a stored config) under their new names, with
        one deprecation line each."""
        if isinstance(data, dict):
            data = upgrade_mapping({"pretrain": data}, "PretrainConfig")["pretrain"]
        return data

    model: str = "albef-tiny"
    """Model config name from the registry (``albef-base``, ``albef-tiny``, ``blip2-base``, ``siglip2-b16``,
    ``clip-b16``, ``dual-tiny``; see falcon_cli/models/configs): its ``framework`` picks ALBEF, BLIP-2 or a dual
    encoder."""
    epochs: int = Field(3, ge=1)
    """Training epochs (epoch 0 is uniform for every composer)."""
    max_steps_per_epoch: int | None = Field(None, ge=1)
    """Cut each epoch after this many steps (smoke tests); None = the whole epoch: every batch its
    composer makes, so every pair is trained once (unless ``composer.drop_last``)."""
    batch_size: int = Field(32, ge=2)
    """Batch size PER PROCESS (the global batch = batch_size × world size, printed at start)."""
    encoders: EncodersConfig = EncodersConfig()
    """Where the encoders' weights come from; input sizes."""
    losses: LossesConfig = LossesConfig()
    """The losses' variants and weights."""
    composer: ComposerConfig = ComposerConfig()
    """How mini-batches are composed."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """FALCON's learned scheduler (``composer.name: falcon``)."""
    false_negatives: FalseNegativesConfig = FalseNegativesConfig()
    """How the losses treat likely false negatives."""
    optim: OptimizerConfig = OptimizerConfig()
    """The VLP model's optimiser and schedule."""
    loader: LoaderConfig = LoaderConfig()
    """How images are read and transformed."""
    runtime: RuntimeConfig = RuntimeConfig()
    """Device, precision, compilation, distributed limits."""
    logging: LoggingConfig = LoggingConfig()
    """Metrics: how often, where."""
    checkpoints: CheckpointsConfig = CheckpointsConfig()
    """Checkpoints: how often, how many kept."""
    eval: PretrainEvalConfig = PretrainEvalConfig()
    """Zero-shot retrieval during and after training."""

    @model_validator(mode="after")
    def _check_false_negative_methods(self) -> "PretrainConfig":
        """Each false-negative method, and the oracle's masks, on the ITC they work on."""
        fn, itc = self.false_negatives, self.losses.itc
        if fn.method != "none" and itc != "grit":
            raise ValueError(f"false_negatives.method={fn.method} works on the in-batch ITC; set losses.itc: grit")
        if (fn.same_image == "mask" or fn.oracle != "keep") and itc != "grit":
            what = "same_image=mask" if fn.same_image == "mask" else f"oracle={fn.oracle}"
            raise ValueError(f"false_negatives.{what} works on the in-batch ITC; set losses.itc: grit")
        if fn.oracle == "mask_itc" and self.composer.name == "falcon":
            raise ValueError(
                "false_negatives.oracle=mask_itc keeps ITM's mining as it is, and FALCON's reward would measure "
                "ITM with the pairs masked: use false_negatives.oracle=mask with composer falcon"
            )
        if fn.method != NO_METHOD and (check := FALSE_NEGATIVE_METHODS.get(fn.method).check) is not None:
            check(fn.settings(), self)  # (what the method needs of the rest of the run)
        return self

    @model_validator(mode="after")
    def _fill_itc_consistency_weight(self) -> "PretrainConfig":
        """The one place a method's own ITC consistency weight is filled in (its paper's)."""
        framework = self._framework()
        if self.losses.itc_consistency_weight is None:
            method = self.false_negatives.method
            self.losses.itc_consistency_weight = (
                framework.consistency_weight
                if method == NO_METHOD
                else FALSE_NEGATIVE_METHODS.get(method).consistency_weight
            )
        return self

    @model_validator(mode="after")
    def _check_search_spaces(self) -> "PretrainConfig":
        """Search spaces that hold a batch."""
        size = self.composer.search_space_size
        if COMPOSERS.get(self.composer.name).search_spaces and size < self.batch_size:
            raise ValueError(
                f"composer.search_space_size ({size}) is smaller than batch_size ({self.batch_size}): the "
                f"{self.composer.name} composer builds each batch inside one search space; use a "
                f"composer.search_space_size of at least {self.batch_size}"
            )
        return self

    @model_validator(mode="after")
    def _check_reward_for_model(self) -> "PretrainConfig":
        """FALCON's reward, one the model's framework has; FALCON's own start and reward only where FALCON runs."""
        framework = self._framework()
        reward = self.scheduler.reward.name
        if self.composer.name != "falcon":
            for key, value, is_set in (
                ("scheduler.init_q", self.scheduler.init_q, self.scheduler.init_q is not None),
                ("scheduler.reward.name", reward, reward == "itm_progress"),
            ):
                if is_set:
                    raise ValueError(
                        f"{key}={value} is a setting of FALCON's scheduler, which composer.name={self.composer.name} "
                        "does not run: set composer.name: falcon, or remove it"
                    )
        if self.composer.name == "falcon" and reward not in framework.rewards:
            raise ValueError(
                f"scheduler.reward.name={reward}: {self.model} is a {framework.name} model, whose rewards are "
                f"{', '.join(framework.rewards)}"
                + (
                    " (BLIP-2 has no MLM: its reward is itg)"
                    if reward == "mlm" and framework.name == "blip2"
                    else " (it has no ITM head to judge a pick: positive_margin stands in)"
                    if reward.endswith("+itm")
                    else " (it has no ITM head)"
                    if "itm" not in framework.losses
                    else ""
                )
            )
        return self

    @model_validator(mode="after")
    def _check_step_capture(self) -> "PretrainConfig":
        """What a captured step (runtime.graph_step) can hold."""
        method = self.false_negatives.method
        if self.runtime.graph_step and method != NO_METHOD and not FALSE_NEGATIVE_METHODS.get(method).capturable:
            raise ValueError(
                f"runtime.graph_step=true cannot capture false_negatives.method={method}: it asks the host in the "
                "middle of the step (MAFA's judge scores the pairs it mines); set runtime.graph_step=false"
            )
        return self

    @model_validator(mode="after")
    def _check_framework_settings(self) -> "PretrainConfig":
        """What the model's framework (ALBEF, BLIP-2, dual encoder) allows."""
        framework = self._framework()
        enc = self.encoders
        if not framework.frozen_image_encoder and enc.vision_trainable_epochs:
            raise ValueError(
                f"encoders.vision_trainable_epochs={enc.vision_trainable_epochs}: a BLIP-2 setting (its frozen "
                f"image encoder); {self.model} trains its image encoder throughout"
            )
        for key, allowed in framework.fixed_settings:
            value = self.setting(key)
            if value != allowed:
                raise ValueError(
                    f"{key}={value}: not available for {framework.title} models ({self.model}); "
                    f"leave {key} at {allowed}"
                )
        if "unimodal" in (enc.vision_weights, enc.text_weights) and not framework.unimodal_init:
            raise ValueError(
                f"unimodal weights: the unimodal stage trains ALBEF's encoders (a ViT and a BERT); "
                f"{self.model} is a {framework.title} model"
            )
        if framework.weight_fields["text"] is None and enc.text_weights is not None:
            raise ValueError(
                f"encoders.text_weights={enc.text_weights}: a {framework.title} ({self.model}) loads the whole "
                "open_clip model from encoders.vision_weights (a pretrained tag or a file); leave text_weights unset"
            )
        if "caption" in framework.losses:
            caption_reward = self.composer.name == "falcon" and "caption" in self.scheduler.reward.name
            if (self.losses.caption_weight > 0 or caption_reward) and not get_model_config(self.model).has_decoder:
                raise ValueError(
                    f"{self.model} has no captioning decoder (decoder_layers: 0): set losses.caption_weight: 0 "
                    "and a reward without caption (itc, alignment), or use a model config with a decoder"
                )
        return self

    def setting(self, key: str):
        """The value of a dotted key below ``pretrain`` (``losses.itc``)."""
        node = self
        for part in key.split("."):
            node = getattr(node, part)
        return node

    def _framework(self):
        """The :class:`~falcon_cli.frameworks.Framework` of ``model`` (a ValueError naming the valid models if it
        is not registered)."""
        try:
            return model_framework(self.model)
        except FalconError as exc:
            raise ValueError(str(exc)) from None
