"""Tests for falcon_cli.reporting.figures: the q-over-training figure is a real PNG with the right content."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from falcon_cli.reporting.figures import NO_Q_MESSAGE, q_over_training
from tests.conftest import PNG_MAGIC, assert_png


def _batches() -> pd.DataFrame:
    """Epoch 0 uniform (no q), epochs 1-2 FALCON with q drifting down."""
    rng = np.random.default_rng(0)
    rows = [{"epoch": 0, "q": np.nan, "sampler": "uniform"} for _ in range(16)]
    rows += [{"epoch": 1, "q": float(v), "sampler": "falcon"} for v in rng.beta(5, 2, 32)]
    rows += [{"epoch": 1, "q": np.nan, "sampler": "falcon"} for _ in range(4)]  # chain starts
    rows += [{"epoch": 2, "q": float(v), "sampler": "falcon"} for v in rng.beta(2, 5, 32)]
    return pd.DataFrame(rows)


def test_q_over_training_writes_png_with_expected_content(tmp_path, captured):
    df = _batches()
    out = q_over_training(df, tmp_path / "figs" / "q.png")
    assert out == tmp_path / "figs" / "q.png"
    assert_png(out)
    (ax,) = captured[0].axes
    assert list(ax.get_xticks()) == [0, 1, 2]  # every epoch shown, including the uniform one
    assert ax.get_ylim() == (0.0, 1.0)
    assert ax.get_title() and ax.get_xlabel() == "epoch" and "q" in ax.get_ylabel()
    # The mean line is the per-epoch mean of the non-NaN q.
    (mean_line,) = [line for line in ax.get_lines() if line.get_label() == "mean q"]
    ref = df.dropna(subset=["q"]).groupby("epoch")["q"].mean()
    assert list(mean_line.get_xdata()) == [1, 2]
    np.testing.assert_allclose(mean_line.get_ydata(), ref.to_numpy())
    # Epoch 0 (no q) is labelled by its sampler.
    assert any(t.get_text() == "uniform" for t in ax.texts)
    # One box per epoch with q: the median of each box matches the data.
    medians = [
        line
        for line in ax.get_lines()
        if line.get_label() != "mean q" and len(line.get_xdata()) == 2 and line.get_ydata()[0] == line.get_ydata()[1]
    ]
    assert {round(float(m.get_ydata()[0]), 9) for m in medians} >= {
        round(float(v), 9) for v in df.dropna(subset=["q"]).groupby("epoch")["q"].median()
    }


def test_q_over_training_replaces_existing_file(tmp_path):
    path = tmp_path / "q.png"
    path.write_bytes(b"old")
    q_over_training(_batches(), path)
    assert_png(path)


def test_q_over_training_all_nan_still_writes_png(tmp_path, captured):
    df = pd.DataFrame({"epoch": [0, 0, 1, 1], "q": [np.nan] * 4, "sampler": ["uniform", "uniform", "grit", "grit"]})
    out = q_over_training(df, tmp_path / "q.png")
    assert_png(out)
    (ax,) = captured[0].axes
    assert any(t.get_text() == NO_Q_MESSAGE for t in ax.texts)
    assert list(ax.get_xticks()) == [0, 1]


def test_q_over_training_empty_table_and_missing_columns(tmp_path):
    out = q_over_training(
        pd.DataFrame({"epoch": pd.Series([], dtype=int), "q": pd.Series([], dtype=float)}), tmp_path / "empty.png"
    )
    assert out.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="q"):
        q_over_training(pd.DataFrame({"epoch": [0]}), tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()
