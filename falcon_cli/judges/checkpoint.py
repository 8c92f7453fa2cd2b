"""A falcon checkpoint as a judge: its own ITM head scores the pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from falcon_cli.data.images import load_image
from falcon_cli.errors import FalconError
from falcon_cli.judges.base import JudgedPair, check_batch_size, itm_scores
from falcon_cli.models.encoders import FalconEncoder
from falcon_cli.models.families import model_family
from falcon_cli.runtime.precision import autocast, pick_device, resolve_precision


class CheckpointJudge:
    """p(match) = the softmax of a falcon checkpoint's ITM logits (ALBEF or BLIP-2), class 1.

    ``path`` is a falcon run directory (its latest checkpoint is used) or one checkpoint
    directory inside ``<run>/checkpoints/``. Images go through the ``test`` transform at the
    checkpoint's resolution and captions through the run's own tokenizer (truncated to the
    run's ``pretrain.encoders.max_text_length``), as in pretraining.
    """

    def __init__(self, path: str | Path, *, device: str = "auto", fp16: bool = False, batch_size: int = 64):
        self.batch_size = check_batch_size(batch_size)
        self.device = pick_device(device)
        self.precision = resolve_precision("fp16" if fp16 else "fp32", self.device)
        try:
            encoder = FalconEncoder(path, self.device)
        except FalconError as exc:  # the encoder's messages name the embed.encoder key; name the judge instead
            raise FalconError(str(exc).replace("embed.encoder=falcon:", "checkpoint judge: ")) from None
        self.model = encoder.model
        if not model_family(self.model).itm_head:
            raise FalconError(
                f"checkpoint judge: {encoder.checkpoint} is a {self.model.config.framework} model without an "
                "ITM head to judge pairs with; use --judge oracle (shapes), --judge blip, or an ALBEF or "
                "BLIP-2 checkpoint"
            )
        self.image_transform = encoder.image_transform
        self.tokenizer = encoder.tokenizer
        self.checkpoint = Path(encoder.checkpoint)
        self.name = f"checkpoint:{self.checkpoint}"

    def score(self, pairs: Sequence[JudgedPair]) -> np.ndarray:
        """``float64[len(pairs)]`` of the checkpoint's ITM match probabilities."""
        return itm_scores(pairs, self.batch_size, "checkpoint ITM judge", self._itm_logits)

    def _itm_logits(self, batch: Sequence[JudgedPair]) -> torch.Tensor:
        images = torch.stack([self.image_transform(load_image(pair.image)) for pair in batch]).to(self.device)
        text = self.tokenizer([pair.caption for pair in batch])
        input_ids, attention_mask = text["input_ids"].to(self.device), text["attention_mask"].to(self.device)
        with autocast(self.precision, self.device):
            image_tokens, _ = self.model.encode_image(images)
            text_tokens, _ = self.model.encode_text(input_ids, attention_mask)
            return self.model.pair_itm_logits(image_tokens, text_tokens, input_ids, attention_mask)


__all__ = ["CheckpointJudge"]
