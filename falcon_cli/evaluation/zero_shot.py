"""Zero-shot retrieval with ITC similarity: embed a retrieval split, score all pairs, recall@K."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from falcon_cli.evaluation.retrieval import recall_at_k
from falcon_cli.runtime.progress import track


@torch.no_grad()
def itc_scores(model, dataset, tokenizer, device: torch.device, *, batch_size: int = 64, max_length: int = 25,
               autocast=None, num_workers: int = 0) -> torch.Tensor:
    """[n_images, n_texts] cosine similarities of a :class:`RetrievalEvalDataset` under ``model``."""
    import contextlib

    autocast = autocast or contextlib.nullcontext()
    was_training = model.training
    model.eval()
    text_feats = []
    for start in track(range(0, len(dataset.text), batch_size), "embedding texts"):
        chunk = dataset.text[start:start + batch_size]
        tokens = tokenizer(chunk, padding="longest", truncation=True, max_length=max_length, return_tensors="pt").to(device)
        with autocast:
            text_feats.append(model.encode_text(tokens["input_ids"], tokens["attention_mask"])[1].float())
    image_feats = []
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    for batch in track(loader, "embedding images"):
        with autocast:
            image_feats.append(model.encode_image(batch["image"].to(device))[1].float())
    model.train(was_training)
    return torch.cat(image_feats) @ torch.cat(text_feats).t()


def zero_shot_retrieval(model, dataset, tokenizer, device: torch.device, **kwargs) -> dict[str, float]:
    """ITC-only recall@1/5/10 in both directions (percent) on a retrieval eval split."""
    scores = itc_scores(model, dataset, tokenizer, device, **kwargs)
    txt2img = [dataset.txt2img[t] for t in range(len(dataset.text))]
    img2txt = [dataset.img2txt[i] for i in range(len(dataset))]
    return recall_at_k(scores.cpu(), img2txt, txt2img)
