"""Official ALBEF checkpoint files, written for tests from a falcon model's weights.

The names are spelled out here, from ALBEF's ``Pretrain.py`` / ``models/xbert.py`` layout, on
their own (not through falcon's loader), so a wrong mapping in the loader cannot pass by
construction. ``test_albef_checkpoint.py`` also checks the BERT names against transformers'.
"""

from __future__ import annotations

from pathlib import Path

import torch

_EMBEDDINGS = {
    "word": "word_embeddings",
    "position": "position_embeddings",
    "token_type": "token_type_embeddings",
    "norm": "LayerNorm",
}
_LAYER = {
    "self_attn.query": "attention.self.query",
    "self_attn.key": "attention.self.key",
    "self_attn.value": "attention.self.value",
    "self_attn.out": "attention.output.dense",
    "self_attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
_CROSS = {
    "cross_attn.query": "crossattention.self.query",
    "cross_attn.key": "crossattention.self.key",
    "cross_attn.value": "crossattention.self.value",
    "cross_attn.out": "crossattention.output.dense",
    "cross_attn_norm": "crossattention.output.LayerNorm",
}


def albef_layout(model, *, momentum: bool = True, queues: bool = True, finetuned: bool = False) -> dict:
    """``model``'s weights under the keys ALBEF saves: its pretraining layout (``text_encoder.bert.*``,
    ``text_encoder.cls.*``, momentum copies, queues), or with ``finetuned`` a retrieval checkpoint's
    (``text_encoder.embeddings.*`` without ``bert.``, no MLM head)."""
    ours = {k: v.detach().clone() for k, v in model.state_dict().items()}
    text, fusion = model.config.text_layers, model.config.fusion_layers
    bert = "text_encoder." if finetuned else "text_encoder.bert."
    out = {
        k: v for k, v in ours.items() if k.startswith(("visual_encoder.", "vision_proj.", "text_proj.", "itm_head."))
    }
    out["temp"] = ours["temp"]
    for mine, theirs in _EMBEDDINGS.items():
        for p in ("weight", "bias") if mine == "norm" else ("weight",):
            out[f"{bert}embeddings.{theirs}.{p}"] = ours[f"text_encoder.embeddings.{mine}.{p}"]
    out[f"{bert}embeddings.position_ids"] = torch.arange(model.config.max_position_embeddings).expand(1, -1)
    for i in range(text + fusion):
        stack, j = ("text_encoder", i) if i < text else ("fusion_encoder", i - text)
        for mine, theirs in (_LAYER | (_CROSS if i >= text else {})).items():
            for p in ("weight", "bias"):
                out[f"{bert}encoder.layer.{i}.{theirs}.{p}"] = ours[f"{stack}.layers.{j}.{mine}.{p}"]
    if not finetuned:
        out["text_encoder.cls.predictions.bias"] = ours["mlm_head.bias"]
        out["text_encoder.cls.predictions.transform.dense.weight"] = ours["mlm_head.dense.weight"]
        out["text_encoder.cls.predictions.transform.dense.bias"] = ours["mlm_head.dense.bias"]
        out["text_encoder.cls.predictions.transform.LayerNorm.weight"] = ours["mlm_head.norm.weight"]
        out["text_encoder.cls.predictions.transform.LayerNorm.bias"] = ours["mlm_head.norm.bias"]
        out["text_encoder.cls.predictions.decoder.weight"] = ours["text_encoder.embeddings.word.weight"]
        out["text_encoder.cls.predictions.decoder.bias"] = ours["mlm_head.bias"]
    if momentum:  # ALBEF's EMA copies: perturbed, so loading them by mistake would show
        for key in list(out):
            for online in ("visual_encoder.", "text_encoder.", "vision_proj.", "text_proj."):
                if key.startswith(online):
                    out[online[:-1] + "_m." + key[len(online) :]] = (
                        out[key] + 1.0 if out[key].is_floating_point() else out[key]
                    )
    if queues:
        dim = model.config.embed_dim
        out.update(
            image_queue=torch.randn(dim, 64),
            text_queue=torch.randn(dim, 64),
            idx_queue=torch.full((1, 64), -100),
            queue_ptr=torch.zeros(1, dtype=torch.long),
        )
    return out


def write_albef_checkpoint(model, path: Path, **layout) -> Path:
    """Save ``{"model": albef_layout(model), "optimizer": ..., "config": ..., "epoch": ...}`` as ALBEF's
    ``Pretrain.py`` does (``torch.save``)."""
    torch.save(
        {
            "model": albef_layout(model, **layout),
            "optimizer": {"state": {}, "param_groups": []},
            "lr_scheduler": {"last_epoch": 29},
            "config": {"image_res": model.config.image_size, "queue_size": 64},
            "epoch": 29,
        },
        path,
    )
    return path
