"""``itm_progress`` (issue 70's candidate C): the paper's reward, a loss decrease over the model's update, measured
per pick and in the ITM head, where GRIT's hard batches pay.

For each pick (slot k, chosen for the anchor in slot k − 1) the ITM loss of the anchor with its pick as a negative
(both directions, image of one with caption of the other, as the composer's similarity S pairs them) plus the ITM loss
of the anchor's own pair, at θ_k (before the update, :func:`itm_losses` in ``prepare``) minus the same at θ_{k+1}
(after it): how much the model learned to tell this pair apart from this negative. 63 credits an update of 64 pairs,
where the paper's MLM decrease gives one, and credited to the q that chose each pick. Both passes in eval mode (no
dropout noise), under the step's precision; ``scheduler.reward.images: reuse`` scores θ_{k+1} with θ_k's image tokens
(no second image encoding: the fusion and text update only). Two eval-mode passes of the ITM head over 3(b − 1)
pairs and one or two image encodings a step."""

from __future__ import annotations

from types import SimpleNamespace

from falcon_cli.registry import PickScoring, pick_reward


def itm_losses(c: PickScoring, image_tokens=None):
    """Per slot ``[b]`` (slot 0: 0): the ITM loss of each pick as its anchor's negative, the mean of its two
    directions, plus the ITM loss of its anchor's own pair, under the model's current weights in eval mode. Returns
    the losses and the image tokens they used (``image_tokens``, else encoded now)."""
    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    import torch
    from torch.profiler import record_function

    from falcon_cli.runtime.precision import autocast  # (lazy: as above)
    from falcon_cli.sampling.scheduler import chain_pairs  # (lazy: as above)

    images, input_ids, attention_mask = c.inputs[0], c.inputs[1], c.inputs[2]
    b = len(input_ids)
    out = torch.zeros(b, dtype=torch.float32, device=input_ids.device)
    if b < 2:
        return out, image_tokens
    objective = c.objective
    objective.eval()
    try:
        with record_function("falcon/reward"), autocast(c.precision, c.device), torch.no_grad():
            if image_tokens is None:
                image_tokens = objective.model.encode_image(images)[0]
            negative_image, negative_text = chain_pairs(b, input_ids.device)
            own = torch.arange(b - 1, device=input_ids.device)  # each pick's anchor, with its own caption
            image_index, text_index = torch.cat([negative_image, own]), torch.cat([negative_text, own])
            state = SimpleNamespace(image_tokens=image_tokens)  # (what an ITM judgement reads of a training forward)
            p = objective.match_probability(state, input_ids, attention_mask, image_index, text_index).float()
    finally:
        objective.train()
    p = p.clamp(1e-6, 1 - 1e-6)
    negative = -torch.log1p(-p[: 2 * (b - 1)])
    out[1:] = (negative[: b - 1] + negative[b - 1 :]) / 2 - torch.log(p[2 * (b - 1) :])
    return out, image_tokens


def prepare(c: PickScoring):
    """Before the update: the per-pick ITM losses at θ_k, and the image tokens they used."""
    return itm_losses(c)


@pick_reward(
    "itm_progress",
    prepare=prepare,
    frameworks=("albef", "blip2"),
    description="each pick's ITM-loss decrease over the update, with its anchor's own pair (issue 70, candidate C)",
)
def itm_progress(c: PickScoring):
    before, tokens = c.prepared
    after, _ = itm_losses(c, tokens if c.settings.images == "reuse" else None)
    return before - after, None
