"""ALBEF's NLVR2 model: one sentence, two images, a fusion encoder of layer pairs.

ALBEF (``models/model_nlvr.py``, ``models/model_pretrain_nlvr.py``) extends the fusion encoder
to ``2 * fusion_layers`` layers: layer 2k cross-attends to image 0, layer 2k + 1 to image 1, and
within a pair the cross-attention key/value projections are shared. Both layers of pair k start
from pretrained fusion layer k (:meth:`AlbefNLVR2.from_albef`). Two heads read the fused [CLS]
token: ``ta_head`` for text-assignment pretraining
(:mod:`falcon_cli.objectives.text_assignment`) and ``cls_head`` for the NLVR2 decision::

    model = AlbefNLVR2.from_albef(albef)
    logits = model(images0, images1, input_ids, attention_mask)      # [B, 2], NLVR2 head
    fused = model.encode_pair(images0, images1, input_ids, attention_mask)
    ta = model.ta_logits(fused)                                      # [B, 3]
"""

from __future__ import annotations

import torch
from torch import nn

from falcon_cli.models.albef import ALBEF
from falcon_cli.models.bert import BertLayer, TextEncoder, init_bert_weights
from falcon_cli.models.config import AlbefConfig
from falcon_cli.models.vision import build_vision_encoder

__all__ = ["PairFusionEncoder", "AlbefNLVR2"]


class PairFusionEncoder(nn.Module):
    """``2 * fusion_layers`` fusion layers in pairs: layer 2k reads image 0, layer 2k + 1 reads image 1.

    The key/value projections of a pair's cross-attention are shared (ALBEF ties them) by
    construction: the odd layer is built without its own (``shared_cross_kv``) and is called
    with its partner's, so each shared tensor is one parameter, appears once in the state dict
    (``layers.{2k}.cross_attn.key/value``) and receives the gradients of both layers.
    """

    def __init__(self, config: AlbefConfig):
        super().__init__()
        self.layers = nn.ModuleList(
            BertLayer(config, cross_width=config.vision_width, shared_cross_kv=i % 2 == 1)
            for i in range(2 * config.fusion_layers)
        )

    def cross_kv(self, index: int) -> tuple[nn.Linear, nn.Linear]:
        """The (key, value) projections that layer ``index``'s cross-attention uses (its pair's first layer's)."""
        owner = self.layers[index - index % 2].cross_attn
        return owner.key, owner.value

    def forward(
        self,
        text_tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        image_tokens0: torch.Tensor,
        image_tokens1: torch.Tensor,
    ) -> torch.Tensor:
        """Text tokens [B, L, W] (padding mask [B, L]) fused with two images' tokens [B, N, vision_width]."""
        x = text_tokens
        for first, second in zip(self.layers[0::2], self.layers[1::2]):
            x = first(x, attention_mask, image_tokens0)
            x = second(x, attention_mask, image_tokens1, cross_kv=(first.cross_attn.key, first.cross_attn.value))
        return x


class AlbefNLVR2(nn.Module):
    """ALBEF for NLVR2: ``visual_encoder``, ``text_encoder``, ``fusion_encoder`` (a :class:`PairFusionEncoder`),
    ``ta_head`` = Linear(W, 3) (text assignment) and ``cls_head`` = Linear(W, W) -> ReLU -> Linear(W, 2).

    The heads are created outside BERT in ALBEF, so they keep PyTorch's default init.
    """

    def __init__(self, config: AlbefConfig):
        super().__init__()
        self.config = config
        width = config.text_width
        self.visual_encoder = build_vision_encoder(config)
        self.text_encoder = TextEncoder(config)
        self.fusion_encoder = PairFusionEncoder(config)
        init_bert_weights(self.text_encoder)
        init_bert_weights(self.fusion_encoder)
        self.ta_head = nn.Linear(width, 3)
        self.cls_head = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))

    @classmethod
    def from_albef(cls, albef: ALBEF) -> "AlbefNLVR2":
        """An NLVR2 model initialised from a pretrained ALBEF (``Pretrain_nlvr.py``'s remapping).

        Image and text encoders are copied; fusion layers 2k and 2k + 1 are both copied from
        fusion layer k (all parameters, cross-attention included; the shared key/value come from
        layer k too). The heads are new. The result is on ``albef``'s device and dtype.
        """
        model = cls(albef.config)
        ref = next(albef.parameters())
        model.to(device=ref.device, dtype=ref.dtype)
        model.visual_encoder.load_state_dict(albef.visual_encoder.state_dict())
        model.text_encoder.load_state_dict(albef.text_encoder.state_dict())
        for k, source in enumerate(albef.fusion_encoder.layers):
            state = source.state_dict()
            model.fusion_encoder.layers[2 * k].load_state_dict(state)
            # The odd layer owns no key/value: they are the shared ones just loaded into layer 2k.
            model.fusion_encoder.layers[2 * k + 1].load_state_dict(
                {name: v for name, v in state.items() if not name.startswith(("cross_attn.key.", "cross_attn.value."))}
            )
        return model

    def encode_pair(
        self, images0: torch.Tensor, images1: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """Fused tokens ``[B, L, text_width]`` of each sentence with its two images ([B, 3, H, W] each)."""
        # One ViT pass over both image batches (as ALBEF does), then split back.
        image_tokens = self.visual_encoder.forward_features(torch.cat([images0, images1]))
        tokens0, tokens1 = image_tokens.split(images0.shape[0])
        text_tokens = self.text_encoder(input_ids, attention_mask)
        return self.fusion_encoder(text_tokens, attention_mask, tokens0, tokens1)

    def ta_logits(self, fused: torch.Tensor) -> torch.Tensor:
        """Text-assignment logits [B, 3] from the fused [CLS] token."""
        return self.ta_head(fused[:, 0])

    def nlvr_logits(self, fused: torch.Tensor) -> torch.Tensor:
        """NLVR2 logits [B, 2] (index 1 = the sentence is true) from the fused [CLS] token."""
        return self.cls_head(fused[:, 0])

    def forward(
        self,
        images0: torch.Tensor,
        images1: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        head: str = "nlvr",
    ) -> torch.Tensor:
        """Encode the pair and apply ``head``: ``"nlvr"`` -> [B, 2], ``"ta"`` -> [B, 3]."""
        if head not in ("nlvr", "ta"):
            raise ValueError(f"head must be 'nlvr' or 'ta', got {head!r}")
        fused = self.encode_pair(images0, images1, input_ids, attention_mask)
        return self.nlvr_logits(fused) if head == "nlvr" else self.ta_logits(fused)
