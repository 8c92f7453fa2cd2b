"""Batching: stack images and tokenise captions in the DataLoader workers."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from falcon_cli.data.vqa import vqa_collate


def tokenize(tokenizer, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``texts``: padded to the longest, truncated to ``max_length`` tokens,
    as ALBEF's ``tokenizer(..., padding='longest', truncation=True)``."""
    encoded = tokenizer(list(texts), padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


class CaptionTokens:
    """Each caption's token ids, tokenised once and kept: every epoch re-reads every caption, and tokenising a
    batch of 96 (4.7 ms on the 2-core CPU) is on the training loop's critical path wherever the loader has no
    worker processes (FALCON's on-demand batches compose and load between steps). Called on a batch's texts it
    gives exactly :func:`tokenize`'s ``(input_ids, attention_mask)``: each caption truncated to ``max_length``
    tokens, padded on the right with the pad id to the batch's longest (a left-padding tokenizer: :func:`tokenize`
    itself). The memory is one int32 array per distinct caption (COCO's 567K: about 90 MB). ``fixed_length``: every
    batch padded to ``max_length`` instead (``pretrain.runtime.graph_step``: one shape, so one captured graph, for every
    step)."""

    def __init__(self, tokenizer, max_length: int, *, fixed_length: bool = False):
        self.tokenizer, self.max_length, self.fixed_length = tokenizer, max_length, fixed_length
        self.ids: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if getattr(self.tokenizer, "padding_side", "right") != "right":
            input_ids, attention_mask = tokenize(self.tokenizer, texts, self.max_length)
            if self.fixed_length and input_ids.shape[1] < self.max_length:  # (on the left, as the tokenizer pads)
                extra = self.max_length - input_ids.shape[1]
                input_ids = torch.nn.functional.pad(input_ids, (extra, 0), value=self.tokenizer.pad_token_id)
                attention_mask = torch.nn.functional.pad(attention_mask, (extra, 0), value=0)
            return input_ids, attention_mask
        missing = [text for text in dict.fromkeys(texts) if text not in self.ids]
        if missing:
            encoded = self.tokenizer(missing, truncation=True, max_length=self.max_length)["input_ids"]
            self.ids.update((text, np.asarray(ids, dtype=np.int32)) for text, ids in zip(missing, encoded))
        rows = [self.ids[text] for text in texts]
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        width = self.max_length if self.fixed_length else int(lengths.max())
        input_ids = np.full((len(rows), width), self.tokenizer.pad_token_id, dtype=np.int64)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = row
        attention_mask = (np.arange(input_ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
        return torch.from_numpy(input_ids), torch.from_numpy(attention_mask)


class TextCollate:
    """Base of the collates: a tokenizer and the token limit of its texts."""

    def __init__(self, tokenizer, max_length: int = 30):
        self.tokenizer = tokenizer
        self.max_length = max_length


class PretrainCollate(TextCollate):
    """Turn pretraining items into ``{"images", "input_ids", "attention_mask", "pair_ids"}`` (the reference
    truncates captions to 25 tokens). ``images`` is None when the items carry none (preloaded images). Each
    caption is tokenised once (:class:`CaptionTokens`): the next epochs read its ids. ``fixed_length``: every
    batch's captions padded to ``max_length`` (``pretrain.runtime.graph_step``)."""

    def __init__(self, tokenizer, max_length: int = 25, *, fixed_length: bool = False):
        super().__init__(tokenizer, max_length)
        self.captions = CaptionTokens(tokenizer, max_length, fixed_length=fixed_length)

    def __call__(self, items: Sequence[dict]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = self.captions([item["caption"] for item in items])
        return {
            "images": torch.stack([item["image"] for item in items]) if "image" in items[0] else None,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "pair_ids": torch.tensor([item["pair_id"] for item in items], dtype=torch.long),
        }


class RetrievalCollate(TextCollate):
    """Retrieval fine-tuning items -> ``{"images", "input_ids", "attention_mask", "image_idx"}``."""

    def __call__(self, items: Sequence[dict]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = tokenize(self.tokenizer, [item["caption"] for item in items], self.max_length)
        return {
            "images": torch.stack([item["image"] for item in items]),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "image_idx": torch.tensor([item["image_idx"] for item in items], dtype=torch.long),
        }


class VqaCollate(TextCollate):
    """VQA items (:class:`~falcon_cli.data.vqa.VQADataset`) -> images, tokenised questions and, when the
    items have answers, tokenised answers (``[CLS] answer [SEP]``) with their weights and per-question counts."""

    def __init__(self, tokenizer, max_length: int = 30, max_answer_length: int = 10):
        super().__init__(tokenizer, max_length)
        self.max_answer_length = max_answer_length

    def __call__(self, items: Sequence[dict]) -> dict:
        batch = vqa_collate(items)
        batch["question_ids"], batch["question_mask"] = tokenize(self.tokenizer, batch["question"], self.max_length)
        if "answers" in batch:
            batch["answer_ids"], batch["answer_mask"] = tokenize(
                self.tokenizer, batch["answers"], self.max_answer_length
            )
            batch["n"] = torch.tensor(batch["n"], dtype=torch.long)
        return batch


class Nlvr2Collate(TextCollate):
    """NLVR2 items -> ``{"images0", "images1", "input_ids", "attention_mask", "labels", "index"}``."""

    def __call__(self, items: Sequence[dict]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = tokenize(self.tokenizer, [item["sentence"] for item in items], self.max_length)
        return {
            "images0": torch.stack([item["image0"] for item in items]),
            "images1": torch.stack([item["image1"] for item in items]),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": torch.tensor([item["label"] for item in items], dtype=torch.long),
            "index": torch.tensor([item["index"] for item in items], dtype=torch.long),
        }
