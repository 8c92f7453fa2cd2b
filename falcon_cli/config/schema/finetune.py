"""The ``finetune`` stage's section: retrieval, VQA and NLVR2 fine-tuning."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from falcon_cli.config.paths import InputPath
from falcon_cli.config.schema.base import Loggers, Section, TaskName


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
    grad_clip: float | None = Field(None, gt=0)
    """Clip the global gradient norm to this value; None = no clipping (ALBEF's fine-tuning)."""
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
    """As ``pretrain.runtime.preempt_grace_s``: on SIGTERM, SIGUSR1 or SIGUSR2 every rank finishes its step, the task
    checkpoints that exact point and the command exits with status 75 (``--resume`` continues from it)."""
    loggers: Loggers = ["jsonl"]
    """Where the metrics go, as ``pretrain.logging.loggers``: ``jsonl`` (always written), ``tensorboard``, ``wandb``,
    ``mlflow``, each task's under ``finetune/<task>/loggers/<name>/`` (docs/monitoring.md)."""

    @model_validator(mode="after")
    def _check(self) -> "FinetuneConfig":
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must be distinct, got {self.tasks}")
        if not set(self.vqa.train_splits) or len(set(self.vqa.train_splits)) != len(self.vqa.train_splits):
            raise ValueError(f"vqa.train_splits must name train and/or val once each, got {self.vqa.train_splits}")
        return self
