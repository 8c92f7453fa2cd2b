"""Pieces of fine-tuning and evaluation: resolution changes, configs, separate t2i scores, sharded accuracy."""

from __future__ import annotations

import pytest
import torch

from falcon_cli.config.schema import EvaluateConfig, FinetuneConfig, RetrievalFinetuneConfig
from falcon_cli.errors import FalconError
from falcon_cli.evaluation.eccv import coco_1k_recalls
from falcon_cli.models.pretrained import albef_from_checkpoint, at_resolution, find_checkpoint
from falcon_cli.models.registry import create_model
from falcon_cli.models.weights import save_weights
from falcon_cli.runtime.checkpoint import WEIGHTS


def test_checkpoint_at_another_resolution(tmp_path):
    model = create_model("albef-tiny", vocab_size=60)
    save_weights(model, tmp_path / WEIGHTS)
    same = albef_from_checkpoint(tmp_path)
    for key, value in model.state_dict().items():
        assert torch.equal(same.state_dict()[key], value), key
    bigger = albef_from_checkpoint(tmp_path, image_size=96)
    assert bigger.config.image_size == 96 and bigger.num_image_tokens == (96 // 8) ** 2 + 1
    assert bigger.visual_encoder.pos_embed.shape[1] == bigger.num_image_tokens
    # Only the position embeddings change; the [CLS] position is kept as it is.
    assert torch.equal(bigger.visual_encoder.pos_embed[:, 0], model.visual_encoder.pos_embed[:, 0])
    assert torch.equal(bigger.text_encoder.embeddings.word.weight, model.text_encoder.embeddings.word.weight)
    with torch.no_grad():
        tokens, _ = bigger.encode_image(torch.randn(2, 3, 96, 96))
    assert tokens.shape == (2, bigger.num_image_tokens, model.config.vision_width)
    with pytest.raises(FalconError, match="multiple of the model's patch size"):
        at_resolution(model.state_dict(), model.config, 100)
    assert find_checkpoint(tmp_path, "x") == tmp_path
    with pytest.raises(FalconError, match="not found"):
        find_checkpoint(tmp_path / "nope", "finetune.checkpoint")


def test_config_checks():
    with pytest.raises(ValueError, match="not a multiple of batch_size"):
        RetrievalFinetuneConfig(queue_size=100, batch_size=32)
    with pytest.raises(ValueError, match="distinct"):
        FinetuneConfig(tasks=["vqa", "vqa"])
    with pytest.raises(ValueError, match="at least one model"):
        EvaluateConfig(retrieval={"models": []})
    assert (
        FinetuneConfig().retrieval.lr == 1e-5
        and FinetuneConfig().vqa.lr == 2e-5
        and FinetuneConfig().nlvr2.batch_size == 16
    )


def test_coco_1k_takes_separate_t2i_scores():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(10, 50, generator=g)
    img2txt = [list(range(5 * i, 5 * i + 5)) for i in range(10)]
    txt2img = [t // 5 for t in range(50)]
    plain = coco_1k_recalls(scores, img2txt, txt2img, folds=2)
    assert coco_1k_recalls(scores, img2txt, txt2img, folds=2, scores_t2i=scores.t().clone()) == plain
    perfect_t2i = torch.zeros(50, 10)
    perfect_t2i[torch.arange(50), torch.tensor(txt2img)] = 1.0
    out = coco_1k_recalls(scores, img2txt, txt2img, folds=2, scores_t2i=perfect_t2i)
    assert out["coco1k_t2i_R@1"] == 100.0 and out["coco1k_i2t_R@1"] == plain["coco1k_i2t_R@1"]
