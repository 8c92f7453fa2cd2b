"""A BLIP image–text matching (ITM) judge, through Hugging Face transformers.

The paper identifies false negatives with "the pretrained BLIP-129M model" (methods §1.10):
a BLIP ViT-B pretrained on 129M image–text pairs, whose ITM head predicts matched / not
matched. That checkpoint is not published on the Hugging Face hub as a retrieval model. The
closest public ITM checkpoint is ``Salesforce/blip-itm-base-coco``: the same BLIP ViT-B
architecture, pretrained on the 129M-pair corpus and then fine-tuned for COCO retrieval (the
ITM head included), hence the default. Any other ``BlipForImageTextRetrieval`` checkpoint,
or a local directory holding one and its processor, can be given instead; ``NAME@REVISION`` pins a
hub id to a revision (a commit sha, for a judge that cannot change under a run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from falcon_cli.data.images import load_image
from falcon_cli.errors import FalconError
from falcon_cli.judges.base import JudgedPair, check_batch_size, first_line, itm_scores
from falcon_cli.runtime.hub import HubRef, hub_hint, is_local, note_hub, note_local, prepare_hub
from falcon_cli.runtime.precision import autocast, pick_device, resolve_precision

DEFAULT_BLIP_MODEL = "Salesforce/blip-itm-base-coco"
"""The public BLIP ITM checkpoint closest to the paper's BLIP-129M judge (see the module docstring)."""


class BlipJudge:
    """p(match) from a ``BlipForImageTextRetrieval`` ITM head: ``softmax(itm logits)[:, 1]``.

    ``model`` is a hub id (``NAME@REVISION`` pins it) or a local directory with the model and its processor;
    ``what`` is the config key it came from (for errors and the run's record). Pairs are
    scored in batches of ``batch_size`` on ``device`` (``auto``: CUDA when available);
    ``fp16`` runs the model under float16 autocast (CUDA only).
    """

    def __init__(
        self,
        model: str | Path = DEFAULT_BLIP_MODEL,
        *,
        device: str = "auto",
        fp16: bool = False,
        batch_size: int = 64,
        what: str = "judge_model",
    ):
        self.model_name = str(model)
        self.name = f"blip:{self.model_name}"
        self.batch_size = check_batch_size(batch_size)
        self.device = pick_device(device)
        self.precision = resolve_precision("fp16" if fp16 else "fp32", self.device)
        self.processor, self.model = _load_blip(self.model_name, what)
        self.model = self.model.to(self.device).eval()

    def score(self, pairs: Sequence[JudgedPair]) -> np.ndarray:
        """``float64[len(pairs)]`` of BLIP ITM match probabilities."""
        return itm_scores(pairs, self.batch_size, "BLIP ITM judge", self._itm_logits)

    def _itm_logits(self, batch: Sequence[JudgedPair]) -> torch.Tensor:
        inputs = self.processor(
            images=[load_image(pair.image) for pair in batch],
            text=[pair.caption for pair in batch],
            return_tensors="pt",
            padding="longest",
            truncation=True,
        )
        with autocast(self.precision, self.device):
            return self.model(
                input_ids=inputs["input_ids"].to(self.device),
                attention_mask=inputs["attention_mask"].to(self.device),
                pixel_values=inputs["pixel_values"].to(self.device),
                use_itm_head=True,
            ).itm_score


def _load_blip(model: str, what: str = "judge_model"):
    """(processor, ``BlipForImageTextRetrieval``) for a hub id or local directory (``what``: its config key); failures
    are one line; what loaded is noted for the run's manifest."""
    from transformers import AutoProcessor, BlipForImageTextRetrieval

    path = Path(model).expanduser()
    looks_local = is_local(model)
    if looks_local and not path.is_dir():
        raise FalconError(
            f"BLIP judge model {model}: no such directory; give a directory saved with save_pretrained "
            f"or a hub id such as {DEFAULT_BLIP_MODEL}"
        )
    ref = None if looks_local else HubRef.parse(model, what)
    source, revision = (str(path), None) if ref is None else (ref.repo, ref.revision)
    if ref is not None:
        prepare_hub()
    try:
        processor = AutoProcessor.from_pretrained(source, revision=revision)
        blip = BlipForImageTextRetrieval.from_pretrained(source, revision=revision)
    except Exception as exc:  # OSError offline / unknown id, ValueError / KeyError for a wrong model type, ...
        why = ("" if looks_local else hub_hint(model)) or (
            "model hubs may be unreachable from here, so download it elsewhere and give the local directory"
        )
        raise FalconError(
            f"BLIP judge model {model}: cannot load a BlipForImageTextRetrieval model and processor "
            f"({first_line(exc)}); {why} (save_pretrained of the model and its processor)"
        ) from None
    if not callable(processor) or not hasattr(processor, "image_processor") or not hasattr(processor, "tokenizer"):
        raise FalconError(
            f"BLIP judge model {model}: the processor found ({type(processor).__name__}) is not an "
            "image+text processor; save the BlipProcessor next to the model"
        )
    if ref is None:
        note_local(path, what)
    else:
        note_hub(ref, what)
    return processor, blip


__all__ = ["BlipJudge", "DEFAULT_BLIP_MODEL"]
