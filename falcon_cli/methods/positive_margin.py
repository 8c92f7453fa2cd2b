"""The positive-margin rewards (ours): no loss decrease, but each pick scored from the step's own forward.

``positive_margin``: each pick's similarity to its anchor (the composer's S), charged ``1 + overshoot`` times for
every bit it rises above the anchor's own pair less ``margin`` (a pick past its anchor's own pair is a likely false
negative). ``positive_margin+itm`` (ALBEF, BLIP-2) also charges the model's own ITM match probability of the pick with
its anchor (one no-grad eval-mode pass of the fusion layers over the batch's 2(b − 1) chained pairs);
``positive_margin+oracle`` (a diagnostic on a shapes world) charges the world's ground truth instead (p = 1 for a pick
that truly matches its anchor, else 0): what a perfect judge would buy, the ceiling of every ``+itm`` charge. How a
judge's p is charged is ``scheduler.reward.itm_charge``; ``hardness: rank`` pays a pick its rank instead of its
margin, so that only the judge says where hard stops paying."""

from __future__ import annotations

from falcon_cli.registry import PickScoring, pick_reward


def oracle_match(composed, device):
    """Per slot ``[b]`` on ``device``: 1.0 where the shapes world's oracle says the pick truly matches its anchor
    (``Batch.chosen_is_fn``), else 0.0; slot 0 (no pick) 0. A chained slot the oracle did not judge is an error (the
    composer was built without the world's truth)."""
    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    import torch

    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    from falcon_cli.errors import FalconError

    truth = composed.chosen_is_fn.float()
    if len(truth) > 1 and torch.isnan(truth[1:]).any():
        raise FalconError(
            "reward=positive_margin+oracle: the batch's picks carry no oracle verdict (the dataset is not "
            "a shapes world, or the composer was built without its truth); use reward=positive_margin+itm"
        )
    out = torch.zeros(len(truth), dtype=torch.float32)
    out[1:] = truth[1:]
    return out.to(device)


def itm_match(c: PickScoring):
    """Per slot ``[b]``: the ITM match probability of each pick with its anchor (slot 0: 0), in eval mode (the head's
    judgement without dropout noise), under the training step's precision."""
    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    from torch.profiler import record_function

    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    from falcon_cli.runtime.precision import autocast
    from falcon_cli.sampling.scheduler import chain_pairs, pick_match

    b = len(c.inputs[1])
    image_index, text_index = chain_pairs(b, c.inputs[1].device)
    c.objective.eval()
    try:
        with record_function("falcon/reward"), autocast(c.precision, c.device):
            pairs = c.objective.match_probability(c.out, c.inputs[1], c.inputs[2], image_index, text_index)
    finally:
        c.objective.train()
    return pick_match(pairs, b)


def pick_worth(c: PickScoring):
    """Per slot ``[b]``: what each pick's hardness is worth before any judge (slot 0: 0), and its hardness S."""
    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    from falcon_cli.sampling.scheduler import chain_hardness, charged_margin

    s = c.settings
    hardness, own = chain_hardness(c.out.image_feat, c.out.text_feat)
    if s.hardness == "rank":  # its rank among the anchor's candidates
        worth = c.composed.quantile_rank.float().nan_to_num(0.0).to(hardness.device)
        worth[:1] = 0
    else:
        worth = charged_margin(hardness, own, s.overshoot, s.margin)
    return worth, hardness


def judged(c: PickScoring, match):
    """The worth of each pick charged its judge's ``match`` probability (``scheduler.reward.itm_charge``), and the
    judge's record ``[b - 1, 2]`` (the probability, the charge per unit of weight)."""
    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    import torch

    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    from falcon_cli.sampling.scheduler import excess_over_hardness, expected_worth

    s = c.settings
    worth, hardness = pick_worth(c)
    if s.itm_charge == "expected":  # the hardness only as far as the judge calls the pick a true negative
        judged_worth = expected_worth(worth, match, s.itm_weight)
        charge, worth = (worth - judged_worth) / (s.itm_weight or 1.0), judged_worth
    else:
        charge = excess_over_hardness(match, hardness) if s.itm_charge == "excess" else match
        worth = worth - s.itm_weight * charge
    return worth, torch.stack([match[1:].double(), charge[1:].double()], 1)


def level_worth(record, settings, grid, verdict=None):
    """``scheduler.update.credit: levels``: the worth ``[k, L]`` of every level's pick for each step's anchor, from
    the composer's record (``level_hardness``, ``level_own``: the epoch's cached features), as the training forward's
    own picks are scored; with ``verdict`` (``[k, L]``, the oracle's) the judge's charge too. ``hardness: rank``: each
    level's pick is worth its level's q (``grid``, ``[L]``). Steps not taken stay NaN (the scheduler leaves them
    out); a taken step whose level the oracle did not judge is an error."""
    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    import torch

    # (lazy: validating a config loads this file; torch and the model load when a step is scored)
    from falcon_cli.errors import FalconError
    from falcon_cli.sampling.scheduler import judged_worth, margin_worth

    level_hardness = record["level_hardness"].float()
    if settings.hardness == "rank":  # the level itself, where a step was taken
        worth = grid.to(level_hardness.device).float().expand_as(level_hardness)
        worth = worth.masked_fill(torch.isnan(level_hardness), float("nan"))
    else:
        worth = margin_worth(
            level_hardness, record["level_own"].float()[..., None], settings.overshoot, settings.margin
        )
    if verdict is None:
        return worth
    verdict = verdict.to(worth.device)
    if torch.isnan(verdict).logical_and(~torch.isnan(worth)).any():
        raise FalconError(
            "reward=positive_margin+oracle: the composer's level picks carry no oracle verdict (the "
            "dataset is not a shapes world); use reward=positive_margin"
        )
    p = verdict.nan_to_num(0.0)
    w = settings.itm_weight
    worth = judged_worth(worth, p, w) if settings.itm_charge == "expected" else worth - w * p
    return worth.masked_fill(torch.isnan(verdict), float("nan"))


@pick_reward(
    "positive_margin",
    score_levels=lambda record, settings, grid: level_worth(record, settings, grid),
    description="each pick's similarity to its anchor, charged past the anchor's own pair (ours)",
)
def positive_margin(c: PickScoring):
    return pick_worth(c)[0], None


@pick_reward(
    "positive_margin+itm",
    frameworks=("albef", "blip2"),
    judged=True,
    description="the positive margin less the model's own ITM belief that the pick matches its anchor (ours)",
)
def positive_margin_itm(c: PickScoring):
    return judged(c, itm_match(c))


@pick_reward(
    "positive_margin+oracle",
    score_levels=lambda record, settings, grid: level_worth(record, settings, grid, record["level_fn"]),
    judged=True,
    oracle=True,
    description="the positive margin less the shapes world's ground truth of each pick (a diagnostic, ours)",
)
def positive_margin_oracle(c: PickScoring):
    return judged(c, oracle_match(c.composed, c.out.image_feat.device))
