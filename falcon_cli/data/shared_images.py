"""Which pretraining pairs share an image: in-batch negatives that are false by construction.

COCO has five captions per image, so a pretraining set holds five pairs per image, and the
shapes world several. Two such pairs in one batch make each other's caption a negative of an
image it describes. Hard-negative composers make this likely: the text most similar to an
image is usually another caption of that very image. :class:`SharedImages` finds these pairs
for a batch on its device, so the objective can mask them (``pretrain.false_negatives.same_image: mask``)
and the audit can count them.

Pairs share an image when their entries carry the same ``image_id`` (if every entry carries
one, as COCO's and the shapes world's do) and otherwise when their resolved image paths are
the same file path.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from falcon_cli.data.pretrain import PretrainRecord


def image_keys(records: Sequence[PretrainRecord]) -> list:
    """Each record's image identity: its ``image_id`` when every record has one, else its resolved path."""
    if records and all(r.extra.get("image_id") is not None for r in records):
        return [("id", r.extra["image_id"]) for r in records]
    return [("path", str(r.image)) for r in records]


class SharedImages:
    """Look up, for the pair ids of a batch, which of them show the same image.

    Args:
        records: every pretraining record (their ``pair_id`` must be distinct).
        device: where the lookup tables live (the training device: no host copies per step).
    """

    def __init__(self, records: Sequence[PretrainRecord], device: torch.device | str = "cpu"):
        groups: dict = {}
        image_of = [groups.setdefault(key, len(groups)) for key in image_keys(records)]
        ids = torch.tensor([r.pair_id for r in records], dtype=torch.long)
        order = torch.argsort(ids)
        self.pair_ids = ids[order].to(device)
        self.image = torch.tensor(image_of, dtype=torch.long)[order].to(device)
        self.num_images = len(groups)

    def images(self, pair_ids: Tensor, *, check: bool = True) -> Tensor:
        """[B] int64 image index of each pair (pairs with the same image get the same index). ``check``:
        fail on an unknown pair id (a host synchronisation; the training loop, whose ids come from
        the dataset itself, skips it)."""
        ids = pair_ids.to(self.pair_ids.device).long()
        rows = torch.searchsorted(self.pair_ids, ids).clamp_max(len(self.pair_ids) - 1)
        if check and not bool((self.pair_ids[rows] == ids).all()):
            missing = ids[self.pair_ids[rows] != ids]
            raise KeyError(f"pair_id {int(missing[0])} is not a pretraining pair")
        return self.image[rows]

    def mask(self, pair_ids: Tensor, *, check: bool = True) -> Tensor:
        """bool [B, B], True where pairs i != j share an image (rows images, columns texts: symmetric)."""
        image = self.images(pair_ids, check=check)
        same = image.reshape(-1, 1) == image.reshape(1, -1)
        return same & ~torch.eye(len(image), dtype=torch.bool, device=same.device)
