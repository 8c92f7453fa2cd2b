"""False-negative handling inside the pretraining objective: MAFA, SRCL, DiHT and GloFND.

Each method is one :class:`FalseNegatives` object that :class:`~falcon_cli.objectives.vlp.VlpObjective`
asks for the batch's ITC (and, for MAFA, for the ITM partners and extra MLM pairs). They all
combine with any batch composer; they all work on the in-batch (GRIT) ITC:

* :class:`PlainItc` (``none``) — GRIT-VLP's ITC, unchanged;
* :class:`Mafa` — connection mining with a frozen discriminator (converted positives in the ITC
  targets, the ITM labels and extra MLM pairs; ambiguous ones swap in the second-hardest ITM
  negative) plus S-ITC label smoothing from epoch 1 (:mod:`falcon_cli.objectives.mafa`);
* :class:`Srcl` — negatives weighted by an α-mixture of a frozen auxiliary model's and the
  current model's similarities, α falling from 1 to 0 (:func:`~falcon_cli.objectives.reweighted_itc.itc_srcl`);
* :class:`Diht` — DiHT's HN-NCE (:func:`~falcon_cli.objectives.reweighted_itc.itc_hn_nce`);
* :class:`Glofnd` — per-pair learned thresholds; negatives above them leave the ITC
  denominators (:mod:`falcon_cli.objectives.glofnd`).

A dual encoder trained with SigLIP's sigmoid loss asks :meth:`FalseNegatives.sigmoid` instead: every
(image, text) pair is its own binary term there, so each method says what it does to a pair's term
(convert its label to +1, drop it, or weight it; see that method).

What changes per step comes in a :class:`StepContext` (the batch's pair ids, the epoch, the step
of the run). After each forward, ``flagged`` (bool [B, B] per direction: image anchors over texts, text
anchors over images) says which in-batch negatives the method treated as false (MAFA: converted; GloFND:
dropped), ``weights`` (while watched) the weight SRCL or DiHT gave each negative, and ``stats`` holds the
step's counts, for the metrics log and for measuring the method against an oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from falcon_cli.objectives.common import as_temperature, image_text_similarity
from falcon_cli.objectives.glofnd import GlofndThresholds, cosine_matrices, glofnd_active, glofnd_drop_masks, itc_glofnd
from falcon_cli.objectives.itc import ItcOutput, itc_grit
from falcon_cli.objectives.mafa import connection_mining, smoothing
from falcon_cli.objectives.reweighted_itc import (
    itc_hn_nce,
    itc_srcl,
    negative_log_weights,
    srcl_log_weights,
    srcl_mix,
    srcl_weights,
)
from falcon_cli.objectives.sigmoid import distributed_sigmoid_loss
from falcon_cli.runtime.distributed import all_gather_cat


@dataclass
class StepContext:
    """What a false-negative method needs to know about the step beyond the features."""

    pair_ids: Tensor
    """[B] int64 pair ids of the batch, in batch order."""
    epoch: int = 0
    """The training epoch (MAFA smooths from epoch 1; GloFND starts at its start epoch)."""
    step: int = 0
    """The 0-based global optimiser step (SRCL's mixing schedule)."""
    total_steps: int = 1
    """Optimiser steps in the whole run."""
    same_image: Tensor | None = None
    """bool [B, B]: pairs i != j of the batch that show the same image, to remove from the ITC
    denominators (``pretrain.false_negatives.same_image: mask``); None = none removed."""
    mask_itm: bool = True
    """Whether ITM's negative mining skips the ``same_image`` pairs too (``pretrain.false_negatives.oracle: mask_itc``
    keeps them out of the ITC alone: the ceiling of a method that changes only the ITC)."""
    progress: Tensor | None = None
    """``step / total_steps`` as a 0-d float tensor on the device (``pretrain.runtime.graph_step``: a captured step
    reads the schedule from it, so one graph serves every step); None: the methods read ``step`` and ``total_steps``."""

    @property
    def itm_excluded(self) -> Tensor | None:
        """The pairs ITM's negative mining skips: ``same_image`` unless the mask is the ITC's alone."""
        return self.same_image if self.mask_itm else None


class FalseNegatives(nn.Module):
    """Base: how the ITC treats negatives. Subclasses override :meth:`itc`."""

    name = "none"

    def __init__(self) -> None:
        super().__init__()
        self.flagged: tuple[Tensor, Tensor] | None = None
        """What the step judged false, per direction: (image anchors over texts [B, B], text anchors over images
        [B, B]), bool, off the diagonal (MAFA converts, GloFND drops); None for a method that flags nothing."""
        self.weights: tuple[Tensor, Tensor] | None = None
        """The step's weight of every in-batch negative in the ITC denominator, per direction as ``flagged``
        (SRCL, DiHT), kept only while :attr:`watched` (a weight below 1 down-weights the pair)."""
        self.watched = False
        """Set by :class:`FlagsAgainstOracle`: keep the step's weights for it (they cost a [B, B] pass)."""
        self.mining = None
        self.stats: dict[str, float | Tensor] = {}

    def _reset(self, stats: dict | None = None) -> None:
        """A new step: nothing flagged, weighted or mined yet."""
        self.flagged, self.weights, self.mining, self.stats = None, None, None, stats or {}

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        """State a checkpoint keeps as weight files (``{file stem: module}``): none, but GloFND's thresholds."""
        return {}

    def itc(
        self,
        image_feat: Tensor,
        text_feat: Tensor,
        temperature: Tensor,
        consistency_weight: float,
        context: StepContext | None,
    ) -> ItcOutput:
        """The batch's ITC loss (plain GRIT ITC here, without the pairs that share an image if the context
        names them)."""
        self._reset()
        return itc_grit(
            image_feat, text_feat, temperature, consistency_weight=consistency_weight, exclude=_same_image(context)
        )

    def sigmoid(
        self,
        image_feat: Tensor,
        text_feat: Tensor,
        logit_scale: Tensor,
        logit_bias: Tensor,
        context: StepContext | None,
    ) -> Tensor:
        """The batch's SigLIP sigmoid loss (:func:`~falcon_cli.objectives.sigmoid.distributed_sigmoid_loss`: under
        DDP every rank's texts are negatives too), with this method's treatment of the pairs it judges:

        * ``none``: plain (pairs that share an image dropped if the context names them);
        * MAFA: a converted pair (image i and caption j found to match, in either direction's mining) gets
          label +1 (*convert*); S-ITC's label smoothing has no counterpart for independent binary terms and
          is not applied;
        * GloFND: a pair above either anchor's threshold (image i's λ_I or caption j's λ_T) is removed
          (*drop*; the divisor stays B);
        * DiHT: each negative pair's term is weighted by the mean of its two anchors' HN-NCE weights
          ``(N - 1) softmax_{j != i}(β t s_ij)`` (the positive keeps weight 1: α has no counterpart);
        * SRCL: the same with SRCL's weights ``(N - 1) softmax_{j != i}(-δ cos_mix_ij)``.
        """
        self._reset()
        return distributed_sigmoid_loss(image_feat, text_feat, logit_scale, logit_bias, exclude=_same_image(context))


def pair_weights(w_i2t: Tensor, w_t2i: Tensor) -> Tensor:
    """One weight per (image i, text j) pair [B, B] from two anchors' weights: the mean of image i's weight of
    text j (``w_i2t[i, j]``) and text j's weight of image i (``w_t2i[j, i]``)."""
    return (w_i2t + w_t2i.t()) / 2


class PlainItc(FalseNegatives):
    """``none``: GRIT-VLP's in-batch ITC with its consistency term (ALBEF's framework), or, with
    ``label_smoothing=0.1, stop_gradient=False`` and no consistency term, BLIP-2's ITC as LAVIS defines it
    (symmetric InfoNCE over the best query's similarity, targets smoothed by 0.1, gradient to both sides)."""

    def __init__(self, *, label_smoothing: float = 0.0, stop_gradient: bool = True):
        super().__init__()
        self.label_smoothing, self.stop_gradient = float(label_smoothing), bool(stop_gradient)

    def itc(self, image_feat, text_feat, temperature, consistency_weight, context):
        self._reset()
        return itc_grit(
            image_feat,
            text_feat,
            temperature,
            consistency_weight=consistency_weight,
            exclude=_same_image(context),
            label_smoothing=self.label_smoothing,
            stop_gradient=self.stop_gradient,
        )


def _same_image(context: StepContext | None) -> Tensor | None:
    return None if context is None else context.same_image


def _needs_context(method: str, context: StepContext | None) -> StepContext:
    if context is None:
        raise ValueError(f"false_negatives={method} needs the step's pair ids (a StepContext)")
    return context


class Diht(FalseNegatives):
    """DiHT's HN-NCE: negatives importance-weighted by ``(N - 1) softmax(β · logits)``; the positive by α."""

    name = "diht"

    def __init__(self, beta: float = 0.5, alpha: float = 1.0):
        super().__init__()
        self.beta, self.alpha = float(beta), float(alpha)

    def itc(self, image_feat, text_feat, temperature, consistency_weight, context):
        self._reset()
        out = itc_hn_nce(
            image_feat,
            text_feat,
            temperature,
            beta_i2t=self.beta,
            beta_t2i=self.beta,
            alpha=self.alpha,
            consistency_weight=consistency_weight,
        )
        if self.watched:  # (the loss's own weights: from its detached logits)
            self.weights = tuple(
                negative_log_weights(self.beta * sim.detach()).exp() for sim in (out.sim_i2t, out.sim_t2i)
            )
        return out

    def sigmoid(self, image_feat, text_feat, logit_scale, logit_bias, context):
        self._reset()
        with torch.no_grad():
            logits = (
                image_text_similarity(image_feat.detach().float(), text_feat.detach().float()) * logit_scale.detach()
            )
            weights = pair_weights(
                negative_log_weights(self.beta * logits).exp(), negative_log_weights(self.beta * logits.t()).exp()
            )
        return distributed_sigmoid_loss(image_feat, text_feat, logit_scale, logit_bias, negative_weights=weights)


class Srcl(FalseNegatives):
    """SRCL: each negative weighted by ``(N - 1) softmax_j(-δ · cos_mix)``, ``cos_mix`` the α-mixture of a
    frozen auxiliary model's cosine (features looked up by pair id) and the current model's, α = 1 → 0."""

    name = "srcl"

    def __init__(
        self, aux_features: Callable[[Tensor], tuple[Tensor, Tensor]], *, delta: float = 5.0, until: float = 1.0
    ):
        super().__init__()
        self.aux_features, self.delta, self.until = aux_features, float(delta), float(until)

    def itc(self, image_feat, text_feat, temperature, consistency_weight, context):
        context = _needs_context(self.name, context)
        aux_image, aux_text = self.aux_features(context.pair_ids)
        mix = srcl_mix_at(context, self.until)
        self._reset({"srcl_mix": mix})
        aux_image, aux_text = aux_image.to(image_feat.device).float(), aux_text.to(image_feat.device).float()
        log_weights = srcl_log_weights(image_feat, text_feat, aux_image, aux_text, mix, self.delta)
        if self.watched:  # (the loss's own weights)
            self.weights = (log_weights[0].exp(), log_weights[1].exp())
        return itc_srcl(
            image_feat,
            text_feat,
            temperature,
            aux_image_feat=aux_image,
            aux_text_feat=aux_text,
            mix=mix,
            delta=self.delta,
            consistency_weight=consistency_weight,
            log_weights=log_weights,
        )

    def sigmoid(self, image_feat, text_feat, logit_scale, logit_bias, context):
        context = _needs_context(self.name, context)
        aux_image, aux_text = self.aux_features(context.pair_ids)
        mix = srcl_mix_at(context, self.until)
        self._reset({"srcl_mix": mix})
        w_i2t, w_t2i = srcl_weights(
            image_feat,
            text_feat,
            aux_image_feat=aux_image.to(image_feat.device).float(),
            aux_text_feat=aux_text.to(image_feat.device).float(),
            mix=mix,
            delta=self.delta,
        )
        return distributed_sigmoid_loss(
            image_feat, text_feat, logit_scale, logit_bias, negative_weights=pair_weights(w_i2t, w_t2i)
        )


def srcl_mix_at(context: StepContext, until: float) -> float | Tensor:
    """SRCL's mixing weight α at the context's step (a 0-d tensor from ``context.progress`` where given)."""
    if context.progress is not None:
        return (1.0 - context.progress / float(until)).clamp(min=0.0)
    return srcl_mix(context.step, context.total_steps, until=until)


class Glofnd(FalseNegatives):
    """GloFND: per-pair thresholds λ_I, λ_T learned by a per-index Adam on the quantile subgradient;
    in-batch negatives above them are dropped from the ITC denominators, from ``start_epoch`` on.

    Under DDP each rank updates the thresholds of its own batch; the updated rows (thresholds and
    Adam state) are then all-gathered, so every rank holds the same thresholds for every pair.
    ``adam_step``: Adam's bias-correction step, ``epoch`` (``t = epoch + 1``, the authors' code)
    or ``count`` (each pair's own number of updates); see :mod:`falcon_cli.objectives.glofnd`."""

    name = "glofnd"

    def __init__(
        self, pair_ids, *, alpha: float = 0.01, lr: float = 0.05, start_epoch: int = 1, adam_step: str = "epoch"
    ):
        super().__init__()

        self.thresholds = GlofndThresholds(pair_ids, alpha, lr=lr, adam_step=adam_step)
        self.start_epoch = int(start_epoch)

    def checkpoint_parts(self) -> dict[str, nn.Module]:
        """The per-pair thresholds and their Adam state."""
        return {"glofnd": self.thresholds}

    def itc(self, image_feat, text_feat, temperature, consistency_weight, context):
        context = _needs_context(self.name, context)
        self._reset()
        if not glofnd_active(context.epoch, self.start_epoch):
            return itc_grit(
                image_feat, text_feat, temperature, consistency_weight=consistency_weight, exclude=context.same_image
            )
        _, _, lambda_image, lambda_text = self._step_thresholds(image_feat, text_feat, context)
        itc, drop_i2t, drop_t2i = itc_glofnd(
            image_feat,
            text_feat,
            temperature,
            lambda_image=lambda_image,
            lambda_text=lambda_text,
            consistency_weight=consistency_weight,
            exclude=context.same_image,
        )
        self._record(drop_i2t, drop_t2i, lambda_image, lambda_text, flagged=(drop_i2t, drop_t2i))
        return itc

    def sigmoid(self, image_feat, text_feat, logit_scale, logit_bias, context):
        context = _needs_context(self.name, context)
        self._reset()
        if not glofnd_active(context.epoch, self.start_epoch):
            return distributed_sigmoid_loss(image_feat, text_feat, logit_scale, logit_bias, exclude=context.same_image)
        cos_i2t, cos_t2i, lambda_image, lambda_text = self._step_thresholds(image_feat, text_feat, context)
        drop_i2t, drop_t2i = glofnd_drop_masks(cos_i2t, cos_t2i, lambda_image.reshape(-1), lambda_text.reshape(-1))
        dropped = drop_i2t | drop_t2i.t()  # a pair above either of its anchors' thresholds
        removed = dropped if context.same_image is None else dropped | context.same_image.to(dropped.device).bool()
        self._record(drop_i2t, drop_t2i, lambda_image, lambda_text, flagged=(dropped, dropped.t()))
        return distributed_sigmoid_loss(image_feat, text_feat, logit_scale, logit_bias, exclude=removed)

    def _step_thresholds(self, image_feat: Tensor, text_feat: Tensor, context: StepContext):
        """(cos_i2t, cos_t2i, λ_I, λ_T) of the batch: its cosines and its pairs' thresholds after this step's update
        from them (under DDP, with every rank's updates shared), on the features' device."""
        cos_i2t, cos_t2i = cosine_matrices(image_feat.detach(), text_feat.detach())
        lambda_image, lambda_text = self.thresholds.update(context.pair_ids, cos_i2t, cos_t2i, epoch=context.epoch)
        self._share_updates(context.pair_ids)
        return cos_i2t, cos_t2i, lambda_image.to(image_feat.device), lambda_text.to(image_feat.device)

    def _record(
        self,
        drop_i2t: Tensor,
        drop_t2i: Tensor,
        lambda_image: Tensor,
        lambda_text: Tensor,
        *,
        flagged: tuple[Tensor, Tensor],
    ) -> None:
        """What the step flagged (per direction), and its stats as 0-d tensors (read, and synchronised, only on the
        steps the metrics log writes)."""
        self.flagged, self.mining = flagged, None
        self.stats = {
            "fn_dropped_i2t": drop_i2t.sum(),
            "fn_dropped_t2i": drop_t2i.sum(),
            "glofnd_lambda_image": lambda_image.mean(),
            "glofnd_lambda_text": lambda_text.mean(),
        }

    @torch.no_grad()
    def _share_updates(self, pair_ids: Tensor) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        t = self.thresholds
        local, everyone = t.rows(pair_ids), t.rows(all_gather_cat(pair_ids.to(t.ids.device)))
        for name in t.STATE:
            buffer = getattr(t, name)
            buffer[everyone] = all_gather_cat(buffer[local].contiguous())


class Mafa(FalseNegatives):
    """MAFA: efficient connection mining with a frozen discriminator plus S-ITC label smoothing.

    ``discriminator(image_pair_ids, text_pair_ids, epoch)`` returns p(match) [n] for pairs made of
    one batch pair's image and another's caption (any judge: a falcon checkpoint's ITM head, BLIP,
    the shapes oracle). It is called once per step for the 2B hardest candidates. ``mlm_pairs``:
    the extra MLM pairs, one per conversion (``per_direction``, MAFA's code) or per distinct pair
    (``distinct``); see :mod:`falcon_cli.objectives.mafa`."""

    name = "mafa"

    def __init__(
        self,
        discriminator: Callable[[Tensor, Tensor, int], Tensor],
        *,
        high: float = 0.8,
        low: float = 0.5,
        smoothing: float = 0.5,
        mlm_pairs: str = "per_direction",
    ):
        super().__init__()
        self.discriminator = discriminator
        self.high, self.low, self.smoothing = float(high), float(low), float(smoothing)
        self.mlm_pairs = mlm_pairs

    def _mine(self, image_feat: Tensor, text_feat: Tensor, temperature, context: StepContext):
        """Connection mining of the batch (no gradient); sets ``flagged``, ``mining`` and ``stats``."""
        pair_ids = context.pair_ids

        def score(image_index: Tensor, text_index: Tensor) -> Tensor:
            ids = pair_ids.to(image_index.device)
            return self.discriminator(ids[image_index], ids[text_index], context.epoch)

        with torch.no_grad():
            v, t = image_feat.detach().float(), text_feat.detach().float()
            tau = as_temperature(temperature)
            tau = tau.detach() if isinstance(tau, Tensor) else tau
            sim = image_text_similarity(v, t) / tau  # rows images; its transpose is the text-anchor view
            mining = connection_mining(sim, sim.t(), score, high=self.high, low=self.low, mlm_pairs=self.mlm_pairs)
        eye = torch.eye(len(pair_ids), dtype=torch.bool, device=mining.positive_mask_i2t.device)
        self.flagged, self.mining = (mining.positive_mask_i2t & ~eye, mining.positive_mask_t2i & ~eye), mining
        self.stats = {
            "fn_converted_i2t": mining.converted_i2t,
            "fn_converted_t2i": mining.converted_t2i,
            "fn_swapped_i2t": mining.swapped_i2t,
            "fn_swapped_t2i": mining.swapped_t2i,
        }
        return mining

    def itc(self, image_feat, text_feat, temperature, consistency_weight, context):
        context = _needs_context(self.name, context)
        mining = self._mine(image_feat, text_feat, temperature, context)
        return itc_grit(
            image_feat,
            text_feat,
            temperature,
            consistency_weight=consistency_weight,
            positive_mask=mining.positive_mask_i2t,
            positive_mask_t2i=mining.positive_mask_t2i,
            label_smoothing=smoothing(context.epoch, self.smoothing),
        )

    def sigmoid(self, image_feat, text_feat, logit_scale, logit_bias, context):
        # Mining ranks by the logits t * s (the cosine's order); a pair mined in either direction gets label +1.
        mining = self._mine(image_feat, text_feat, 1.0 / logit_scale.detach(), _needs_context(self.name, context))
        converted = mining.positive_mask_i2t | mining.positive_mask_t2i.t()
        eye = torch.eye(converted.shape[0], dtype=torch.bool, device=converted.device)
        self.flagged, self.mining = (converted & ~eye, converted.t() & ~eye), None  # (no ITM to swap in, no MLM pairs)
        return distributed_sigmoid_loss(image_feat, text_feat, logit_scale, logit_bias, positive_mask=converted)


DIRECTIONS = ("i2t", "t2i")
"""The two directions a method judges negatives in: image anchors over texts, text anchors over images."""


def flag_counts(flagged: Tensor, truth: Tensor) -> Tensor:
    """``int64 [4]``: (flagged and truly matching, flagged but not, truly matching but not flagged, all
    negatives) for one batch; ``flagged`` / ``truth`` bool [B, B] over the in-batch negatives. Counted on
    ``flagged``'s device (no host sync), so the per-epoch totals can be all-reduced there."""
    flagged, truth = flagged.bool(), truth.to(flagged.device).bool()
    off = ~torch.eye(flagged.shape[0], dtype=torch.bool, device=flagged.device)
    return torch.stack(
        [(flagged & truth & off).sum(), (flagged & ~truth & off).sum(), (~flagged & truth & off).sum(), off.sum()]
    ).long()


def weight_sums(weights: Tensor, truth: Tensor) -> Tensor:
    """``float64 [4]``: (the summed weight of the truly matching negatives, their count, the summed weight of the
    true negatives, their count) for one batch; ``weights`` float [B, B], ``truth`` bool [B, B], the diagonal left
    out. On ``weights``' device, like :func:`flag_counts`."""
    truth = truth.to(weights.device).bool()
    off = ~torch.eye(weights.shape[0], dtype=torch.bool, device=weights.device)
    false, true = truth & off, ~truth & off
    w = weights.detach().double()
    return torch.stack([(w * false).sum(), false.sum().double(), (w * true).sum(), true.sum().double()])


class FlagsAgainstOracle:
    """An epoch's running scores of a false-negative method's decisions against the oracle's
    ``truth(pair_ids) -> bool [B, B]`` (rows images, columns texts), in both directions: what it flagged
    (:func:`flag_counts`: MAFA, GloFND) and the weights it gave (:func:`weight_sums`: SRCL, DiHT). Kept on the
    device (no host sync per step) and summed over ranks at the epoch's end."""

    def __init__(self, method: FalseNegatives, truth: Callable[[Tensor], Tensor], device: torch.device):
        self.method, self.truth = method, truth
        method.watched = True
        self.counts = torch.zeros(2, 4, dtype=torch.long, device=device)
        self.sums = torch.zeros(2, 4, dtype=torch.float64, device=device)

    def observe(self, pair_ids: Tensor) -> None:
        """After a step: add what the method flagged or weighted in the batch of ``pair_ids`` (CPU ids) against the
        truth (a text anchor's truth is the transpose: caption i against image j)."""
        flagged, weights = self.method.flagged, self.method.weights
        if flagged is None and weights is None:
            return
        truth = self.truth(pair_ids)
        truths = (truth, truth.t())
        for d in range(2):
            if flagged is not None:
                self.counts[d] += flag_counts(flagged[d], truths[d])
            if weights is not None:
                self.sums[d] += weight_sums(weights[d], truths[d])

    def epoch_summary(self) -> dict[str, float | int | None] | None:
        """The epoch's :func:`flag_summary` over every rank (None when nothing was compared: GloFND before its
        start epoch flags nothing, the plain ITC never does); the counts start again at zero."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(self.counts)
            torch.distributed.all_reduce(self.sums)
        compared = bool(self.counts[:, 3].sum()) or bool(self.sums[:, 1].sum() + self.sums[:, 3].sum())
        summary = flag_summary(self.counts, self.sums) if compared else None
        self.counts.zero_()
        self.sums.zero_()
        return summary

    def state_dict(self) -> dict[str, list]:
        return {"counts": self.counts.tolist(), "sums": self.sums.tolist()}

    def load_state_dict(self, state: dict[str, list]) -> None:
        counts = torch.tensor(state["counts"], dtype=torch.long)
        if counts.dim() == 1:  # (a checkpoint from before both directions were scored: image anchors only)
            counts = torch.stack([counts, torch.zeros_like(counts)])
        self.counts = counts.to(self.counts.device)
        self.sums = torch.tensor(state.get("sums", [[0.0] * 4] * 2), dtype=torch.float64, device=self.sums.device)


def flag_summary(counts: Tensor, sums: Tensor | None = None) -> dict[str, float | int | None]:
    """Precision / recall of the flags against the truth from :func:`flag_counts` totals (``counts`` [4], one
    direction, or [2, 4], both: then each direction's keys prefixed ``i2t_`` / ``t2i_`` and the unprefixed ones
    pooled over both), and the mean weight of the truly matching (``weight_false``) and of the true negatives
    (``weight_true``) from :func:`weight_sums` totals, where the method weighs its negatives."""
    counts = counts.reshape(-1, 4)
    sums = torch.zeros(counts.shape[0], 4, dtype=torch.float64) if sums is None else sums.reshape(-1, 4)
    rows = [(None, counts.sum(0), sums.sum(0))]
    if counts.shape[0] == 2:
        rows += [(d, counts[i], sums[i]) for i, d in enumerate(DIRECTIONS)]
    out: dict[str, float | int | None] = {}
    for direction, c, w in rows:
        prefix = f"{direction}_" if direction else ""
        tp, fp, fn, negatives = (int(v) for v in c.tolist())
        if negatives:
            out.update(
                {
                    f"{prefix}flagged": tp + fp,
                    f"{prefix}true_false_negatives": tp + fn,
                    f"{prefix}negatives": negatives,
                    f"{prefix}precision": tp / (tp + fp) if tp + fp else None,
                    f"{prefix}recall": tp / (tp + fn) if tp + fn else None,
                }
            )
        w_false, n_false, w_true, n_true = (float(v) for v in w.tolist())
        if n_false or n_true:
            out.update(
                {
                    f"{prefix}weight_false": w_false / n_false if n_false else None,
                    f"{prefix}weight_true": w_true / n_true if n_true else None,
                    f"{prefix}false_share": n_false / (n_false + n_true),
                }
            )
    return out


__all__ = [
    "StepContext",
    "FalseNegatives",
    "PlainItc",
    "Diht",
    "Srcl",
    "Glofnd",
    "Mafa",
    "FlagsAgainstOracle",
    "flag_counts",
    "weight_sums",
    "flag_summary",
    "DIRECTIONS",
    "pair_weights",
    "srcl_mix_at",
]
