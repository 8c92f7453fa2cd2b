"""Similarities of image and text features, for one vector per image (ALBEF, dual encoders) or one per learned
query (BLIP-2): the models' own scores, every contrastive loss and every retrieval score go through here."""

from __future__ import annotations

import torch
from torch import Tensor


def image_text_similarity(image_feat: Tensor, text_feat: Tensor) -> Tensor:
    """``[N_images, N_texts]`` similarities of image and text features.

    ``image_feat`` ``[N_i, D]`` (one vector per image: ALBEF, dual encoders) gives ``image_feat @ text_feat.T``;
    ``[N_i, Q, D]`` (one vector per learned query: BLIP-2's Q-Former) gives, as BLIP-2 defines its ITC, the
    largest of an image's Q query similarities to each text. Gradients flow as through the matmul (to the
    maximising query only, for BLIP-2). Every ITC variant, false-negative method and retrieval score goes
    through this one function, so each works with either kind of image feature.
    """
    if image_feat.dim() == 2:
        return image_feat @ text_feat.t()
    if image_feat.dim() != 3:
        raise ValueError(f"image features of shape {tuple(image_feat.shape)}: expected [N, D] or [N, queries, D]")
    return torch.einsum("iqd,td->itq", image_feat, text_feat).amax(dim=-1)


def paired_image_feature(image_feat: Tensor, text_feat: Tensor) -> Tensor:
    """One image vector ``[B, D]`` per pair: ``image_feat`` itself when it is ``[B, D]``; for BLIP-2's
    ``[B, Q, D]`` query features, the query most similar to the pair's own text ``text_feat`` ``[B, D]``
    (MAFA's choice for GRIT search spaces over BLIP-2, appendix G.7). This is what the embedding cache,
    the search spaces and ``falcon embed`` hold, so the composers work on one vector per pair."""
    if image_feat.dim() == 2:
        return image_feat
    best = torch.einsum("bqd,bd->bq", image_feat, text_feat.to(image_feat.dtype)).argmax(dim=1)
    return image_feat[torch.arange(image_feat.shape[0], device=image_feat.device), best]
