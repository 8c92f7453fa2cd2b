"""FALCON's scheduler: ``pretrain.scheduler`` (its network and optimiser), ``.reward`` (what it is paid) and
``.update`` (how a reward becomes its gradient)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from falcon_cli.config.schema.base import Section
from falcon_cli.registry import REWARDS, unknown_name_message


class RewardConfig(Section):
    """``pretrain.scheduler.reward``: what the scheduler is paid for a batch it composed (FALCON's Δ, or ours)."""

    name: str = "mlm"
    """The scheduler's reward, a registered name (:data:`falcon_cli.registry.REWARDS`; a plugin adds one). A loss
    decrease, Algorithm 2's Δ: ``mlm`` (the paper's, ALBEF), ``itg`` (BLIP-2, which has no MLM: the paper's Table 3),
    ``caption`` and ``itc`` (dual encoders: the decoder's captioning loss, SigLIP 2's reward in the later FALCON
    paper, and the contrastive loss), the sums ``itc+itm``, ``itc+itm+mlm``, ``itc+itm+itg``, ``itc+caption``, and
    ``alignment`` (ours: the rise of each pair's own image-text cosine, which a false negative next to it pulls apart;
    per pair with a per-step ``scheduler.update.credit``). A pick score, each pick scored from the training forward (no
    extra pass) and credited to the q that chose it (``scheduler.update.credit: chosen`` or ``levels``):
    ``positive_margin`` (ours: each pick's similarity to its anchor, charged ``1 + scheduler.reward.overshoot`` times
    for every bit it rises above the anchor's own pair, a likely false negative); ``positive_margin+itm`` (ALBEF and
    BLIP-2: less ``scheduler.reward.itm_weight`` times the model's own ITM match probability of the pick with its
    anchor, one no-grad eval-mode pass of the fusion layers over the batch's 2(B - 1) chained pairs; a dual encoder has
    no ITM head, and its only judgement of a pair is the similarity the margin reads); ``positive_margin+oracle`` (a
    diagnostic on a shapes world: the same charge with the world's ground truth as the judge, which no real run has,
    the ceiling of every ``+itm`` charge)."""
    overshoot: float = Field(1.0, ge=0)
    """``scheduler.reward.name: positive_margin``: how much more a pick loses per unit of similarity above its anchor's
    own pair than it gains per unit below (0: the reward falls flat past the pair)."""
    margin: float = Field(0.0, ge=0)
    """``scheduler.reward.name: positive_margin``: the charge starts this far below the anchor's own pair (in units of
    the composer's similarity S, which spans [-2, 2]): a larger margin moves every anchor's best q down."""
    itm_weight: float = Field(2.0, ge=0)
    """``scheduler.reward.name: positive_margin+itm`` (or ``+oracle``): the charge per unit of the judge's match
    probability of a pick with its anchor (0: the positive margin alone). 2 spans the composer's similarity S (in [-2,
    2]), so a pick the head is sure of loses as much as the hardest pick can win."""
    hardness: Literal["margin", "rank"] = "margin"
    """``scheduler.reward.name: positive_margin+itm`` (or ``+oracle``): what a pick's hardness is worth before its
    judge's charge. ``margin``: the positive margin (its similarity to the anchor, charged past the anchor's own pair
    less ``scheduler.reward.margin``); ``rank``: its rank among the anchor's candidates, 0 the easiest, 1 the hardest
    (the batch's ``quantile_rank``; under ``scheduler.update.credit: levels`` each level's q): every anchor's hardness
    on one scale, whatever its own pair, so that only the judge says where hard stops paying. With
    ``scheduler.reward.itm_charge: expected`` a true pick is worth its rank and a false one
    ``-scheduler.reward.itm_weight``. Needs a judge (a rank alone pays for harder without end)."""
    itm_charge: Literal["absolute", "excess", "expected"] = "absolute"
    """``scheduler.reward.name: positive_margin+itm`` (or ``+oracle``, whose p is 0 or 1): what a pick is charged for.
    ``absolute``: the ITM match probability itself (harder picks look more like matches, so it also charges
    hardness, which the margin already prices);
    ``excess``: the probability less the least-squares line of probability on hardness (the composer's S) over
    the batch's picks, i.e. only how much more the model believes a pick matches its anchor than picks of the
    same hardness do: the margin decides how hard, the charge which anchors' hard picks are likely false;
    ``expected``: the pick's worth if the head is right, (1 − p)·margin − ``scheduler.reward.itm_weight``·p: the
    hardness pays only as far as the head calls the pick a true negative, so a pick it is sure of is worth −weight at
    any hardness (the other two add a charge to a margin that keeps paying for hardness)."""
    mode: Literal["train", "eval"] = "train"
    """``train``: the training forward's loss before, one no-grad train-mode pass after (one extra forward);
    ``eval``: two no-grad eval-mode passes (no dropout noise; two extra forwards)."""
    images: Literal["recompute", "reuse"] = "recompute"
    """L_after's image tokens: ``recompute`` (θ_{k+1}'s image encoder: Algorithm 2 exactly) or ``reuse``
    those of the L_before pass (θ_k): Δ then credits the text and fusion update only, for a reward pass
    without the image encoder (most of its cost: falcon/grit per-step time 1.22 -> 1.08 on albef-tiny, CPU)."""

    @field_validator("name")
    @classmethod
    def _known_reward(cls, name: str) -> str:
        """A registered reward (one line with the nearest names otherwise)."""
        if name not in REWARDS:
            raise ValueError(unknown_name_message("reward", name, REWARDS.names()))
        return name

    @model_validator(mode="after")
    def _check_hardness(self) -> "RewardConfig":
        """A rank-valued hardness needs a judge to charge it."""
        if self.hardness == "rank" and not REWARDS.get(self.name).judged:
            judged = [n for n in REWARDS.names() if REWARDS.get(n).judged]
            raise ValueError(
                f"hardness=rank pays for harder picks until a judge charges them: it needs a judged reward "
                f"({' or '.join(judged)}; got {self.name})"
            )
        return self


class SchedulerUpdateConfig(Section):
    """``pretrain.scheduler.update``: how a reward becomes the scheduler's policy gradient (which q it credits, the
    baseline, the entropy bonus)."""

    credit: Literal["batch", "anchor", "chosen", "pair", "levels"] = "batch"
    """Which q a reward credits: ``batch`` (the paper: the batch's Δ for every q), or per step from the
    per-pair decrease Δᵢ (reward: mlm or alignment): ``chosen`` (the q that brought pair i into the batch gets
    Δᵢ), ``anchor`` (the q drawn for anchor i gets Δᵢ), ``pair`` (the mean of both). One more no-grad
    forward per step (L_before per caption). ``levels`` (ours; ``scheduler.reward.name: positive_margin`` or
    ``positive_margin+oracle``): not the one q each anchor drew, but every q of a grid of ``scheduler.update.levels``:
    the composer also finds, at each step, the pick each level would have made for the same anchor among the same
    candidates, the reward scores all of them from the epoch's cached features (and the oracle's verdict), and the
    scheduler moves each anchor's Beta toward the levels that scored above that anchor's mean (no sampled q in
    the gradient, no baseline). ``positive_margin+itm`` cannot: its judge would need a forward of every level's
    pick."""
    levels: int = Field(10, ge=2, le=100)
    """``scheduler.update.credit: levels``: how many q's each anchor is scored at, the centres of equal bins of [0, 1]
    (10: q = 0.05, 0.15, …, 0.95)."""
    advantage_norm: bool = False
    """Divide advantages by their running root-mean-square (the scheduler's step no longer scales with Δ)."""
    entropy: float = Field(0.0, ge=0)
    """Weight of the Beta's entropy in the scheduler's loss (0: the paper): keeps it from sharpening early."""
    baseline: Literal["none", "ema", "batch_mean"] = "none"
    """Subtracted from the reward: ``none`` (the paper), ``ema`` (a moving average of the batch reward) or
    ``batch_mean`` (per-step credit: the mean reward of the batch's other steps)."""
    baseline_decay: float = Field(0.9, ge=0, lt=1)
    """Decay of the ``ema`` reward baseline."""

    @model_validator(mode="after")
    def _check_baseline(self) -> "SchedulerUpdateConfig":
        """A baseline the credit can use."""
        if self.baseline == "batch_mean" and self.credit == "batch":
            raise ValueError(
                "baseline=batch_mean needs a per-step credit (chosen, anchor or pair); "
                "with one reward per batch every advantage would be 0"
            )
        if self.credit == "levels" and self.baseline != "none":
            raise ValueError(
                f"credit=levels is its own baseline (each anchor's mean over the levels): "
                f"set baseline: none (got {self.baseline})"
            )
        return self


class SchedulerConfig(Section):
    """``pretrain.scheduler``: FALCON's learned scheduler (``composer.name: falcon``), its input, network and
    optimiser."""

    level: Literal["instance", "batch"] = "instance"
    """FALCON: one q per anchor (``instance``, the paper's default) or one per batch, drawn from its first pair's
    Beta."""
    quantile_levels: int = Field(100, ge=2)
    """m: quantiles per similarity row (the scheduler's input width)."""
    quantile_temperature: float = Field(1.0, gt=0)
    """Ŝ = softmax(Q / this); 1 = raw cosine sums (methods.md A-1)."""
    features: list[Literal["softmax", "zscore", "positive", "spread"]] = Field(
        default_factory=lambda: ["softmax"], min_length=1
    )
    """The scheduler's input, groups concatenated (falcon_cli/sampling/scheduler_features.py): ``softmax``
    (the paper's Ŝ, τ = scheduler.quantile_temperature), ``zscore`` (the quantiles standardised per row),
    ``positive`` (where the anchor's own pair sits in its row: the share of candidates more similar than
    it, likely false negatives), ``spread`` (the row's standard deviation and range)."""
    hidden: int = Field(256, ge=1)
    """Hidden width of the scheduler MLP."""
    blocks: int = Field(2, ge=0)
    """Residual blocks of the scheduler MLP (2: four linear layers)."""
    lr: float = Field(1e-4, gt=0)
    """Scheduler AdamW learning rate."""
    init_q: float | None = Field(None, gt=0, lt=1)
    """Every anchor's initial mean q: the Beta head starts at this mean, with the paper's concentration α + β ≈ 1.95
    (None: the paper's Beta(0.97, 0.97), mean 0.5). On the composer's q scale (``composer.quantile_scale``): under
    ``log_rank``, 0.9 is about the 2nd most similar of 500 candidates. Where hardness helps, the scheduler then starts
    there, and the reward has to earn any back-off (issue 70's candidate A)."""
    weight_decay: float = Field(0.01, ge=0)
    """Scheduler AdamW weight decay."""
    grad_clip: float | None = Field(None, gt=0)
    """Clip the scheduler's gradient norm (None: no clipping, as in the paper)."""
    max_concentration: float | None = Field(None, gt=0)
    """Cap on α + β (the mean kept); None: no cap (the paper)."""
    lag: int = Field(0, ge=0)
    """FALCON batches composed ahead of training: 0 = Algorithm 2 exactly (batch k+1 from the scheduler
    after update k; its items load between steps); L ≥ 1 = batch k+L is composed with the scheduler after
    update k−1 and loads in worker processes while steps compute (see falcon_cli/sampling/feed.py)."""
    overlap: bool = False
    """Take one step of ``scheduler.lag`` (which must be ≥ 1) from the scheduler instead of the loader: the update of
    step k is made after step k + 1 is launched, so the device trains step k + 1 while the host reads step k's
    reward, updates the scheduler and composes the next batch (on CUDA on a stream of its own: no wait for the step
    in flight); the loader then composes ``scheduler.lag − 1`` batches ahead. The same batches, updates and losses as
    without it (tested); a step's ``reward``, ``advantage`` and ``concentration`` in metrics.jsonl are then those
    of the update made during it: the previous step's (the epoch's last update is in its ``epoch_summary``)."""
    reward: RewardConfig = RewardConfig()
    """What the scheduler is paid (``pretrain.scheduler.reward``)."""
    update: SchedulerUpdateConfig = SchedulerUpdateConfig()
    """How the reward becomes its gradient (``pretrain.scheduler.update``)."""

    @model_validator(mode="after")
    def _check_reward_and_credit(self) -> "SchedulerConfig":
        """Each credit with the rewards it can use; one step late only with a lag to hold it."""
        if self.overlap and self.lag < 1:
            raise ValueError(
                "overlap=true makes the scheduler's update one step late, which is a lag of at least 1: "
                "set scheduler.lag=1 (or more)"
            )
        reward, credit = REWARDS.get(self.reward.name), self.update.credit
        if credit not in reward.credits:
            able = [name for name in REWARDS.names() if credit in REWARDS.get(name).credits]
            raise ValueError(
                f"update.credit={credit} cannot credit reward.name={reward.name}, which can be credited by "
                f"{' or '.join(reward.credits)}"
                + (
                    " (it scores each pick for the anchor that chose it)"
                    if reward.score is not None
                    else " (a per-step credit hands one pair's reward to one q: it needs a per-pair reward)"
                )
                + (
                    "; credit=levels scores every level's pick from cached features (the ITM head would need a "
                    "forward of every level's pick)"
                    if credit == "levels"
                    else ""
                )
                + f"; rewards it can credit: {', '.join(able)}"
            )
        if credit != "batch" and self.level != "instance":
            raise ValueError(f"update.credit={credit} credits each anchor's q: it needs level: instance (got batch)")
        if credit == "levels" and reward.judged and self.reward.itm_charge == "excess":
            raise ValueError(
                "update.credit=levels with reward.itm_charge=excess: the excess is fitted over a "
                "batch's picks, not a grid's; use reward.itm_charge: expected or absolute"
            )
        if len(set(self.features)) != len(self.features):
            raise ValueError(f"features lists a group twice: {self.features}")
        return self
