"""The analytic FLOP count (MFU's numerator) against PyTorch's FlopCounterMode on real passes."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from falcon_cli.models.flops import (
    fusion_forward_flops,
    pretrain_flops_per_pair,
    text_forward_flops,
    vision_forward_flops,
)
from falcon_cli.models.registry import create_model, resolve_model_config
from falcon_cli.objectives.mlm import MlmMask
from falcon_cli.objectives.vlp import VlpObjective


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.fixture()
def tiny():
    torch.manual_seed(0)
    model = create_model("albef-tiny", vocab_size=300)
    for block in model.visual_encoder.blocks:  # explicit attention products: CPU flash SDPA has no FLOP formula
        block.attn.fused_attn = False
    batch, length = 6, 11
    ids = torch.randint(5, 300, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)  # all real: the count runs on the padded length anyway
    images = torch.randn(batch, 3, model.config.image_size, model.config.image_size)
    return model, images, ids, mask


def test_each_part_matches_the_counted_forward(tiny):
    model, images, ids, mask = tiny
    config, batch, length = model.config, ids.shape[0], ids.shape[1]
    with torch.no_grad():
        assert counted(lambda: model.encode_image(images)) == pytest.approx(
            batch * vision_forward_flops(config), rel=1e-9
        )
        assert counted(lambda: model.encode_text(ids, mask)) == pytest.approx(
            batch * text_forward_flops(config, length), rel=1e-9
        )
        tokens, _ = model.encode_text(ids, mask)
        image_tokens, _ = model.encode_image(images)
        assert counted(lambda: model.fuse(tokens, mask, image_tokens)) == pytest.approx(
            batch * fusion_forward_flops(config, length), rel=1e-9
        )


def test_a_training_step_is_about_three_forwards_of_the_counted_parts(tiny):
    model, images, ids, mask = tiny
    objective = VlpObjective(model)
    mlm = MlmMask.sample(
        ids,
        mask,
        probability=0.5,
        generator=torch.Generator().manual_seed(0),
        vocab_size=300,
        mask_token_id=1,
        pad_token_id=0,
        cls_token_id=2,
    )
    batch, masked = ids.shape[0], mlm.selected.sum().item() / ids.shape[0]
    parts = pretrain_flops_per_pair(model.config, ids.shape[1], masked)
    with torch.no_grad():
        forward = counted(lambda: objective(images, ids, mask, mlm))
    # the in-batch similarity products (B x B) are the only matrix products the count leaves out
    assert forward / batch == pytest.approx(parts["total"] / 3, rel=0.01)
    step = counted(lambda: objective(images, ids, mask, mlm).loss.backward())
    # the backward skips the input gradient of the patch embedding (images need none): a little under 3x
    assert step / batch == pytest.approx(parts["total"], rel=0.03)
    assert step / batch < parts["total"]


def test_albef_base_matches_the_issue_arithmetic_and_the_reward_ratios():
    config = resolve_model_config("albef-base")
    plain = pretrain_flops_per_pair(config, 25, 12.5)
    assert vision_forward_flops(config) / 1e9 == pytest.approx(46.4, abs=0.2)  # ViT-B/16 at 257 tokens
    assert plain["total"] / 1e9 == pytest.approx(229, abs=2)
    recompute = pretrain_flops_per_pair(config, 25, 12.5, reward_images="recompute")
    reuse = pretrain_flops_per_pair(config, 25, 12.5, reward_images="reuse")
    assert recompute["total"] / plain["total"] == pytest.approx(1.24, abs=0.01)
    assert reuse["total"] / plain["total"] == pytest.approx(1.04, abs=0.01)
    with pytest.raises(ValueError, match="recompute or reuse"):
        pretrain_flops_per_pair(config, 25, 12.5, reward_images="never")
