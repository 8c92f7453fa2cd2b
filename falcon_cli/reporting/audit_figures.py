"""Figures for ``falcon audit-false-negatives``: how many of a run's negatives were really matches.

A pretraining run uses two kinds of negatives: ``chain`` (the pair the batch composer chose
at similarity quantile q for an anchor) and ``itm`` (the hardest in-batch ITM negative).
The audit judges them and these figures report the false-negative (FN) rates:

* :func:`fn_rate_by_q` — FN rate per training-step window, one line per hardness (q)
  bucket, one panel per kind (FALCON Figure 2, top left).
* :func:`fn_after_filter` — FN ratio left after filtering negatives whose judge score is
  above a threshold τ, and the share of negatives (and of true negatives) that filter
  removes (FALCON Figure 2, bottom left).
* :func:`missed_examples` — a grid of true false negatives the judge missed (low p(match)),
  each with its image, caption and judge score.
* :func:`fn_rate_comparison` — FN rate per training-step window, one line per run, one
  panel per kind.

Like :mod:`falcon_cli.reporting.figures`, figures are built with
:class:`matplotlib.figure.Figure` on an explicit Agg canvas (no ``pyplot``) and written
atomically through :func:`falcon_cli.reporting.figures._save_png`. Every function writes a
PNG even for empty input (the figure then states that there was nothing to draw) and
returns the path it wrote.
"""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from falcon_cli.data.images import load_image
from falcon_cli.errors import FalconError
from falcon_cli.reporting import figures as _figures
from falcon_cli.sampling.oracle_view import expected_q

__all__ = [
    "fn_rate_by_q",
    "fn_after_filter",
    "missed_examples",
    "fn_rate_comparison",
    "scheduler_vs_oracle",
    "NO_BUCKETS_MESSAGE",
    "NO_CURVE_MESSAGE",
    "NO_MISSED_MESSAGE",
    "NO_RATES_MESSAGE",
    "UNREADABLE_IMAGE_MESSAGE",
    "KIND_TITLES",
]

#: Text of :func:`fn_rate_by_q`'s figure when no negative has a hardness to bucket.
NO_BUCKETS_MESSAGE = "no negatives with a hardness (q) to bucket"
#: Text of :func:`fn_after_filter`'s figure when the threshold curve is empty.
NO_CURVE_MESSAGE = "no judged negatives to filter"
#: Text of :func:`missed_examples`'s figure when there is no example.
NO_MISSED_MESSAGE = "no missed false negatives"
#: Text of :func:`fn_rate_comparison`'s figure when no run has a row.
NO_RATES_MESSAGE = "no false-negative rates to compare"
#: Text of :func:`scheduler_vs_oracle`'s figure when the batch log has no oracle view.
NO_ORACLE_VIEW_MESSAGE = "no chained slots with the oracle's view (a quantile composer on a shapes world logs them)"
#: Text drawn on the grey placeholder of an image that cannot be read.
UNREADABLE_IMAGE_MESSAGE = "image not readable"

#: Panel title per kind of negative; other kinds are titled by their name.
KIND_TITLES = {
    "chain": "chain negatives (chosen at quantile q)",
    "itm": "in-batch ITM hardest negatives",
}

_KIND_ORDER = ("chain", "itm")
_DIRECTIONS = {"i2t": "image→text", "t2i": "text→image"}
_WRAP = 40


def _require(frame: pd.DataFrame, columns: Sequence[str], who: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{who}: table is missing column(s) {missing}")


def _ordered_kinds(kinds) -> list[str]:
    """Kinds present, ``chain`` then ``itm``, then any other kind in sorted order."""
    present = {str(k) for k in kinds}
    return [k for k in _KIND_ORDER if k in present] + sorted(present - set(_KIND_ORDER))


def _message_figure(title: str, message: str, path: str | os.PathLike, figsize=(8, 4.5)) -> Path:
    fig = Figure(figsize=figsize)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.axis("off")
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center", wrap=True)
    return _figures._save_png(fig, path)


def _fmt_q(x: float) -> str:
    """0.8 -> '0.8', 1.0 -> '1.0', 0.25 -> '0.25'."""
    s = f"{float(x):.2f}"
    return s[:-1] if s.endswith("0") else s


def _midpoint(frame: pd.DataFrame) -> np.ndarray:
    return (
        pd.to_numeric(frame["first_step"]).to_numpy(dtype="float64")
        + pd.to_numeric(frame["last_step"]).to_numpy(dtype="float64")
    ) / 2.0


def _percent_ylim(ax, values: np.ndarray) -> None:
    """y from 0 to a little above the largest value, never above 100 (%)."""
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 0.0
    ax.set_ylim(0.0, min(100.0, top * 1.15) if top > 0 else 1.0)


def fn_rate_by_q(
    rates: pd.DataFrame,
    path: str | os.PathLike,
    *,
    title: str = "Risk of false negatives across training steps, per similarity quantile q",
) -> Path:
    """Plot the FN rate per training-step window, one line per hardness (q) bucket, to the PNG ``path``.

    ``rates`` has one row per (``kind``, ``window``, ``bucket``) with columns ``kind``
    (``chain`` / ``itm``), ``window``, ``first_step``, ``last_step``, ``bucket``,
    ``hardness_low``, ``hardness_high``, ``negatives``, ``false_negatives`` and ``rate``
    (in [0, 1]). One panel per kind present (chain, then itm), sharing the y axis; in each,
    one line per bucket (ordered by ``hardness_low``, labelled ``q in [low, high]``) with
    x = the window's midpoint step and y = ``rate`` in percent. An empty table gives a
    figure stating :data:`NO_BUCKETS_MESSAGE`. Returns ``path``.
    """
    if len(rates) == 0:
        return _message_figure(title, NO_BUCKETS_MESSAGE, path)
    _require(
        rates,
        ("kind", "window", "first_step", "last_step", "bucket", "hardness_low", "hardness_high", "rate"),
        "fn_rate_by_q",
    )
    kinds = _ordered_kinds(rates["kind"].unique())
    fig = Figure(figsize=(5.5 * len(kinds), 4.5))
    axes = fig.subplots(1, len(kinds), sharey=True, squeeze=False)[0]
    all_y = []
    for ax, kind in zip(axes, kinds):
        sub = rates[rates["kind"].astype(str) == kind]
        buckets = (
            sub.groupby("bucket", sort=False)[["hardness_low", "hardness_high"]]
            .first()
            .sort_values(["hardness_low", "hardness_high"])
        )
        for bucket, bounds in buckets.iterrows():
            rows = sub[sub["bucket"] == bucket]
            x = _midpoint(rows)
            y = pd.to_numeric(rows["rate"]).to_numpy(dtype="float64") * 100.0
            order = np.argsort(x, kind="stable")
            ax.plot(
                x[order],
                y[order],
                marker="o",
                markersize=4,
                label=f"q in [{_fmt_q(bounds['hardness_low'])}, {_fmt_q(bounds['hardness_high'])}]",
            )
            all_y.append(y)
        ax.set_title(KIND_TITLES.get(kind, f"{kind} negatives"))
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, title="hardness bucket", title_fontsize=8)
    axes[0].set_ylabel("false negatives (%)")
    _percent_ylim(axes[0], np.concatenate(all_y))
    fig.suptitle(title)
    fig.tight_layout()
    return _figures._save_png(fig, path)


def fn_after_filter(curve: pd.DataFrame, path: str | os.PathLike, *, judge: str, truth: str) -> Path:
    """Plot what filtering negatives by a judge's score leaves and removes, to the PNG ``path``.

    ``curve`` has one row per (``kind``, ``threshold`` τ) with columns ``negatives`` (all
    negatives of the kind), ``kept`` (score ≤ τ), ``false_negatives_kept``, ``fn_ratio``
    (false_negatives_kept / kept, NaN when nothing is kept) and ``removed_true_negatives``
    (score > τ but truly not a match). Left panel: FN ratio remaining (%) vs τ, one line per
    kind. Right panel: share of negatives removed, 100·(negatives − kept)/negatives (solid),
    and share removed that were true negatives, 100·removed_true_negatives/negatives
    (dashed), vs τ, per kind. The title names the filter ``judge`` and what measured the
    ``truth``. An empty curve gives a figure stating :data:`NO_CURVE_MESSAGE`. Returns ``path``.
    """
    title = f"False negatives after filtering (filter: {judge}; false negatives measured by {truth})"
    if len(curve) == 0:
        return _message_figure(title, NO_CURVE_MESSAGE, path, figsize=(11, 4.5))
    _require(curve, ("kind", "threshold", "negatives", "kept", "fn_ratio", "removed_true_negatives"), "fn_after_filter")
    fig = Figure(figsize=(11, 4.5))
    left, right = fig.subplots(1, 2)
    left_y, right_y = [], []
    for i, kind in enumerate(_ordered_kinds(curve["kind"].unique())):
        color = f"C{i}"
        sub = curve[curve["kind"].astype(str) == kind].sort_values("threshold", kind="stable")
        tau = pd.to_numeric(sub["threshold"]).to_numpy(dtype="float64")
        negatives = pd.to_numeric(sub["negatives"]).to_numpy(dtype="float64")
        kept = pd.to_numeric(sub["kept"]).to_numpy(dtype="float64")
        removed_tn = pd.to_numeric(sub["removed_true_negatives"]).to_numpy(dtype="float64")
        fn_ratio = pd.to_numeric(sub["fn_ratio"]).to_numpy(dtype="float64") * 100.0
        with np.errstate(divide="ignore", invalid="ignore"):
            removed = np.where(negatives > 0, 100.0 * (negatives - kept) / negatives, np.nan)
            removed_true = np.where(negatives > 0, 100.0 * removed_tn / negatives, np.nan)
        left.plot(tau, fn_ratio, marker="o", markersize=3, color=color, label=kind)
        right.plot(tau, removed, marker="o", markersize=3, color=color, label=f"{kind}: all removed")
        right.plot(tau, removed_true, linestyle="--", color=color, label=f"{kind}: true negatives removed")
        left_y.append(fn_ratio)
        right_y.append(np.concatenate([removed, removed_true]))
    left.set_title("false negatives remaining")
    left.set_ylabel("false negatives among kept (%)")
    right.set_title("negatives removed by the filter")
    right.set_ylabel("negatives removed (%)")
    for ax, ys in ((left, left_y), (right, right_y)):
        ax.set_xlabel("filter threshold τ (keep judge p(match) ≤ τ)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        _percent_ylim(ax, np.concatenate(ys))
    fig.suptitle(title)
    fig.tight_layout()
    return _figures._save_png(fig, path)


def _load_or_placeholder(path) -> np.ndarray | None:
    try:
        return np.asarray(load_image(path))
    except (FalconError, OSError, ValueError):
        return None


def missed_examples(examples: Sequence[Mapping], path: str | os.PathLike, *, columns: int = 4) -> Path:
    """Draw a grid of true false negatives the judge missed to the PNG ``path``.

    Each example maps ``direction`` (``i2t`` / ``t2i``), ``anchor_image``,
    ``anchor_caption``, ``negative_image``, ``negative_caption``, ``score`` (the judge's
    p(match)), ``judged_image`` and ``judged_caption`` (the judged pair). One cell per
    example, ``columns`` per row (fewer when there are fewer examples): the judged image,
    above it the direction, the judged caption in quotes and the judge's score, below it
    the anchor's caption for context. An image that cannot be read is drawn as a grey
    placeholder stating :data:`UNREADABLE_IMAGE_MESSAGE`. No example gives a figure stating
    :data:`NO_MISSED_MESSAGE`. Returns ``path``.
    """
    title = "True false negatives the judge missed (low p(match))"
    if columns < 1:
        raise ValueError(f"missed_examples: columns must be >= 1, got {columns}")
    examples = list(examples)
    if not examples:
        return _message_figure(title, NO_MISSED_MESSAGE, path)
    ncols = min(columns, len(examples))
    nrows = math.ceil(len(examples) / ncols)
    fig = Figure(figsize=(3.2 * ncols, 4.4 * nrows + 0.5))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(examples) :]:
        fig.delaxes(ax)
    for ax, ex in zip(axes, examples):
        image = _load_or_placeholder(ex["judged_image"])
        if image is None:
            ax.imshow(np.full((64, 64, 3), 0.8))
            ax.text(
                0.5,
                0.5,
                UNREADABLE_IMAGE_MESSAGE,
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=8,
                color="0.3",
            )
        else:
            ax.imshow(image)
        ax.axis("off")
        direction = _DIRECTIONS.get(str(ex.get("direction")), str(ex.get("direction")))
        score = ex.get("score")
        try:
            score_text = f"{float(score):.2f}"
        except (TypeError, ValueError):
            score_text = "n/a"
        caption = textwrap.fill(f"\u201c{ex['judged_caption']}\u201d", _WRAP)
        ax.set_title(f"{direction}\n{caption}\njudge p(match) = {score_text} \u2014 a true match", fontsize=8)
        ax.text(
            0.5,
            -0.03,
            textwrap.fill(f"anchor: {ex.get('anchor_caption', '')}", _WRAP),
            transform=ax.transAxes,
            ha="center",
            va="top",
            fontsize=7,
            color="0.3",
        )
    fig.suptitle(title)
    fig.tight_layout()
    return _figures._save_png(fig, path)


def fn_rate_comparison(runs: Mapping[str, pd.DataFrame], path: str | os.PathLike) -> Path:
    """Plot the FN rate per training-step window of several runs to the PNG ``path``.

    ``runs`` maps a run name to its table of one row per (``kind``, ``window``) with columns
    ``first_step``, ``last_step``, ``negatives``, ``false_negatives`` and ``rate`` (in
    [0, 1], all hardness buckets together). One panel per kind present in any run (chain,
    then itm), sharing the y axis; in each, one line per run having that kind (labelled by
    the run name, same colour in every panel) with x = the window's midpoint step and
    y = ``rate`` in percent. No row in any run gives a figure stating
    :data:`NO_RATES_MESSAGE`. Returns ``path``.
    """
    title = "false negatives of the used negatives, per run"
    present = {name: frame for name, frame in runs.items() if len(frame)}
    if not present:
        return _message_figure(title, NO_RATES_MESSAGE, path)
    for name, frame in present.items():
        _require(frame, ("kind", "window", "first_step", "last_step", "rate"), f"fn_rate_comparison (run {name!r})")
    kinds = _ordered_kinds(pd.concat([f["kind"].astype(str) for f in present.values()]).unique())
    colors = {name: f"C{i % 10}" for i, name in enumerate(runs)}
    fig = Figure(figsize=(5.5 * len(kinds), 4.5))
    axes = fig.subplots(1, len(kinds), sharey=True, squeeze=False)[0]
    all_y = []
    for ax, kind in zip(axes, kinds):
        for name, frame in present.items():
            rows = frame[frame["kind"].astype(str) == kind]
            if not len(rows):
                continue
            x = _midpoint(rows)
            y = pd.to_numeric(rows["rate"]).to_numpy(dtype="float64") * 100.0
            order = np.argsort(x, kind="stable")
            ax.plot(x[order], y[order], marker="o", markersize=4, color=colors[name], label=str(name))
            all_y.append(y)
        ax.set_title(KIND_TITLES.get(kind, f"{kind} negatives"))
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("false negatives (%)")
    _percent_ylim(axes[0], np.concatenate(all_y))
    fig.suptitle(title)
    fig.tight_layout()
    return _figures._save_png(fig, path)


def scheduler_vs_oracle(
    by_epoch: pd.DataFrame, last: pd.DataFrame, path: str | os.PathLike, *, title: str = ""
) -> Path:
    """What the composer chose against what the oracle says, to the PNG ``path``.

    Left: per epoch, the correlation of each anchor's E[q] (or q) with its false-negative density,
    and the spread (std) of E[q] across anchors (a correlation without spread is a collapsed policy).
    Right: the last epoch's chained slots: the anchor's FN density against the E[q] the composer
    used and the oracle's safe q (means in density bins). ``by_epoch``:
    :func:`~falcon_cli.sampling.oracle_view.summary_by_epoch`; ``last``: that epoch's batch-log rows.
    """
    if by_epoch.empty:
        return _message_figure(title or "scheduler against the oracle", NO_ORACLE_VIEW_MESSAGE, path)

    fig = Figure(figsize=(11, 4.2))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    epochs = by_epoch["epoch"].to_numpy()
    corr = pd.to_numeric(by_epoch["q_fn_density_corr"]).to_numpy(dtype="float64")
    spread = pd.to_numeric(by_epoch["expected_q_std"]).to_numpy(dtype="float64")
    left.plot(epochs, corr, marker="o", label="corr(E[q], anchor FN density)")
    left.plot(epochs, spread, marker="s", label="std of E[q] across anchors")
    left.axhline(0, color="grey", linewidth=0.5)
    left.set(xlabel="epoch", ylim=(-1, 1), title="does q follow the anchor's false negatives?")
    left.legend(fontsize=8)
    chained = last[last["anchor_fn_density"].notna()]
    density = chained["anchor_fn_density"].to_numpy(dtype="float64")
    mean_q = expected_q(chained).to_numpy(dtype="float64")
    mean_q = np.where(np.isnan(mean_q), chained["q"].to_numpy(dtype="float64"), mean_q)
    right.scatter(density, mean_q, s=4, alpha=0.25, label="E[q] per chained slot")
    bins = np.linspace(0, max(float(density.max()), 1e-6), 11)
    which = np.clip(np.digitize(density, bins) - 1, 0, 9)
    centres = (bins[:-1] + bins[1:]) / 2
    for values, style, label in (
        (mean_q, "-o", "E[q], bin mean"),
        (chained["safe_q"].to_numpy(dtype="float64"), "--^", "oracle's safe q, bin mean"),
    ):
        means = np.array(
            [np.nanmean(values[which == b]) if np.any((which == b) & ~np.isnan(values)) else np.nan for b in range(10)]
        )
        right.plot(centres, means, style, label=label)
    right.set(
        xlabel="anchor's false-negative density in its search space",
        ylabel="q",
        ylim=(0, 1),
        title=f"epoch {int(epochs[-1])}",
    )
    right.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _figures._save_png(fig, path)
