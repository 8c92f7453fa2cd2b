"""Batching: stack images and tokenise captions in the DataLoader workers."""

from __future__ import annotations

from typing import Sequence

import torch


class PretrainCollate:
    """Turn pretraining items into ``{"images", "input_ids", "attention_mask", "pair_ids"}``.

    Captions are padded to the longest in the batch and truncated to ``max_length`` tokens
    (the reference: 25), as ALBEF's ``tokenizer(..., padding='longest', truncation=True)``.
    """

    def __init__(self, tokenizer, max_length: int = 25):
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, items: Sequence[dict]) -> dict[str, torch.Tensor]:
        text = self.tokenizer([item["caption"] for item in items], padding="longest", truncation=True,
                              max_length=self.max_length, return_tensors="pt")
        return {
            "images": torch.stack([item["image"] for item in items]),
            "input_ids": text["input_ids"],
            "attention_mask": text["attention_mask"],
            "pair_ids": torch.tensor([item["pair_id"] for item in items], dtype=torch.long),
        }
