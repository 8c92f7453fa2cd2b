"""Figures drawn from a run's artifacts, rendered headless (Agg) and written atomically.

* :func:`q_over_training` — the distribution of the sampled quantile q per epoch, from the
  batch log (``batches.parquet``). FALCON claims the scheduler samples high q (hard
  negatives) early and lower q later; this figure shows whether a run did.

Figures are built with :class:`matplotlib.figure.Figure` on an explicit Agg canvas rather
than through ``pyplot``: no global backend switch, no GUI, no figure registry to leak.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from falcon_cli.artifacts.atomic import atomic_path

__all__ = ["q_over_training", "NO_Q_MESSAGE"]

#: Text of the figure written when no batch slot carries a q.
NO_Q_MESSAGE = "no quantiles were sampled (uniform or GRIT batches only)"


def _save_png(fig: Figure, path: str | os.PathLike) -> Path:
    """Render ``fig`` to PNG at ``path`` atomically (temporary file beside it, then rename)."""
    FigureCanvasAgg(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    return Path(path)


def q_over_training(batches: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Plot the sampled quantile q per epoch (box per epoch + mean line) to the PNG ``path``.

    ``batches`` needs columns ``epoch`` and ``q`` (NaN where a slot had no q: uniform or
    GRIT batches, chain starts); ``sampler`` is used, when present, to label epochs without
    any q. Every epoch present is shown on the x axis. If no row has a q the figure states
    that instead. Returns ``path``.
    """
    missing = [c for c in ("epoch", "q") if c not in batches.columns]
    if missing:
        raise ValueError(f"q_over_training: batches is missing column(s) {missing}; expected the batch log table")
    epochs_col = pd.to_numeric(batches["epoch"], errors="coerce")
    q_col = pd.to_numeric(batches["q"], errors="coerce").astype("float64")
    valid_epoch = epochs_col.notna().to_numpy()
    epoch = epochs_col.to_numpy(dtype="float64", na_value=np.nan)[valid_epoch].astype(np.int64)
    q = q_col.to_numpy(dtype="float64", na_value=np.nan)[valid_epoch]
    sampler = (
        batches["sampler"].astype(str).to_numpy()[valid_epoch]
        if "sampler" in batches.columns
        else np.full(len(epoch), "", dtype=object)
    )

    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    ax.set_title("Sampled quantile q per epoch")
    ax.set_xlabel("epoch")
    ax.set_ylabel("q (sampled quantile)")
    ax.set_ylim(0.0, 1.0)

    has_q = np.isfinite(q)
    if not has_q.any():
        ax.text(0.5, 0.5, NO_Q_MESSAGE, transform=ax.transAxes, ha="center", va="center", wrap=True)
        if len(epoch):
            all_epochs = np.unique(epoch)
            ax.set_xticks(all_epochs)
            ax.set_xlim(all_epochs.min() - 0.5, all_epochs.max() + 0.5)
        return _save_png(fig, path)

    all_epochs = np.unique(epoch)
    q_epochs = np.unique(epoch[has_q])
    groups = [q[has_q & (epoch == e)] for e in q_epochs]
    ax.boxplot(groups, positions=q_epochs, widths=0.6, manage_ticks=False, flierprops={"markersize": 2, "alpha": 0.4})
    ax.plot(q_epochs, [g.mean() for g in groups], marker="o", color="tab:red", label="mean q")
    for e in np.setdiff1d(all_epochs, q_epochs):
        names = sorted({s for s in sampler[epoch == e] if s and s != "nan"})
        ax.text(e, 0.5, "/".join(names) or "uniform", rotation=90, ha="center", va="center", color="0.4")
    ax.set_xticks(all_epochs)
    if len(all_epochs) > 20:
        ax.tick_params(axis="x", labelrotation=90, labelsize=7)
    ax.set_xlim(all_epochs.min() - 0.5, all_epochs.max() + 0.5)
    ax.legend(loc="upper right")
    fig.tight_layout()
    return _save_png(fig, path)
