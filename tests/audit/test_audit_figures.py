"""Tests for falcon_cli.reporting.audit_figures: the false-negative audit figures are real PNGs with the right
content."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text
from PIL import Image

from falcon_cli.reporting.audit_figures import (
    NO_BUCKETS_MESSAGE,
    NO_CURVE_MESSAGE,
    NO_MISSED_MESSAGE,
    NO_RATES_MESSAGE,
    UNREADABLE_IMAGE_MESSAGE,
    fn_after_filter,
    fn_rate_by_q,
    fn_rate_comparison,
    missed_examples,
)
from tests.conftest import PNG_MAGIC, assert_png


def _texts(fig) -> list[str]:
    """Every text drawn on the figure (titles, labels, free texts), newlines folded to spaces."""
    return [" ".join(t.get_text().split()) for t in fig.findobj(Text) if t.get_text()]


# --------------------------------------------------------------------------- fn_rate_by_q

BUCKETS = [(0, 0.8, 1.0), (1, 0.0, 0.5), (2, 0.5, 0.8)]  # deliberately not in hardness order


def _rates() -> pd.DataFrame:
    """itm listed first (the figure must still put chain first); windows listed out of order."""
    rows = []
    for kind, scale in (("itm", 0.5), ("chain", 1.0)):
        for window in (2, 0, 1):
            for bucket, low, high in BUCKETS:
                negatives = 200
                rate = scale * (0.01 * (bucket + 1) + 0.003 * window)
                rows.append(
                    {
                        "kind": kind,
                        "window": window,
                        "first_step": 100 * window,
                        "last_step": 100 * window + 99,
                        "bucket": bucket,
                        "hardness_low": low,
                        "hardness_high": high,
                        "negatives": negatives,
                        "false_negatives": round(rate * negatives),
                        "rate": rate,
                    }
                )
    return pd.DataFrame(rows)


def test_fn_rate_by_q_panels_lines_and_values(tmp_path, captured):
    df = _rates()
    out = fn_rate_by_q(df, tmp_path / "figs" / "by_q.png")
    assert out == tmp_path / "figs" / "by_q.png"
    assert_png(out)
    (fig,) = captured
    chain_ax, itm_ax = fig.axes
    assert "chain" in chain_ax.get_title() and "quantile q" in chain_ax.get_title()
    assert "ITM" in itm_ax.get_title()
    assert chain_ax.get_shared_y_axes().joined(chain_ax, itm_ax)
    assert chain_ax.get_ylabel() == "false negatives (%)"
    for ax, kind in ((chain_ax, "chain"), (itm_ax, "itm")):
        assert ax.get_xlabel() == "training step"
        lines = ax.get_lines()
        # One line per bucket, ordered by hardness, labelled with its q range.
        assert [line.get_label() for line in lines] == ["q in [0.0, 0.5]", "q in [0.5, 0.8]", "q in [0.8, 1.0]"]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [line.get_label() for line in lines]
        for line, bucket in zip(lines, (1, 2, 0)):
            assert line.get_marker() == "o"
            ref = df[(df["kind"] == kind) & (df["bucket"] == bucket)].sort_values("window")
            np.testing.assert_allclose(line.get_xdata(), [49.5, 149.5, 249.5])  # window midpoints
            np.testing.assert_allclose(line.get_ydata(), ref["rate"].to_numpy() * 100.0)
    assert chain_ax.get_ylim()[0] == 0.0 and chain_ax.get_ylim()[1] >= df["rate"].max() * 100.0


def test_fn_rate_by_q_single_kind_gives_one_panel(tmp_path, captured):
    df = _rates()
    fn_rate_by_q(df[df["kind"] == "itm"], tmp_path / "itm.png", title="my title")
    (ax,) = captured[0].axes
    assert "ITM" in ax.get_title() and len(ax.get_lines()) == 3
    assert "my title" in _texts(captured[0])


def test_fn_rate_by_q_empty_states_it(tmp_path, captured):
    out = fn_rate_by_q(_rates().iloc[:0], tmp_path / "empty.png")
    assert_png(out)
    (ax,) = captured[0].axes
    assert [t.get_text() for t in ax.texts] == [NO_BUCKETS_MESSAGE]
    assert not ax.get_lines()
    # A frame without any column is empty too.
    fn_rate_by_q(pd.DataFrame(), tmp_path / "bare.png")
    assert (tmp_path / "bare.png").read_bytes().startswith(PNG_MAGIC)


def test_fn_rate_by_q_missing_column_raises(tmp_path):
    with pytest.raises(ValueError, match="rate"):
        fn_rate_by_q(_rates().drop(columns=["rate"]), tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


# --------------------------------------------------------------------------- fn_after_filter


def _curve() -> pd.DataFrame:
    rows = []
    for kind, fn_base in (("itm", 0.02), ("chain", 0.05)):
        for tau in (1.0, 0.5, 0.9, 0.1):  # out of order on purpose
            negatives = 1000
            kept = int(negatives * tau) if tau > 0.1 else 0
            fnk = int(kept * fn_base * tau)
            rows.append(
                {
                    "kind": kind,
                    "threshold": tau,
                    "negatives": negatives,
                    "kept": kept,
                    "false_negatives_kept": fnk,
                    "fn_ratio": fnk / kept if kept else np.nan,
                    "removed_true_negatives": int((negatives - kept) * 0.75),
                }
            )
    return pd.DataFrame(rows)


def test_fn_after_filter_panels_and_values(tmp_path, captured):
    df = _curve()
    out = fn_after_filter(df, tmp_path / "filter.png", judge="blip-itm-large", truth="shapes oracle")
    assert_png(out)
    (fig,) = captured
    left, right = fig.axes
    texts = _texts(fig)
    assert any("blip-itm-large" in t and "shapes oracle" in t for t in texts)
    assert "%" in left.get_ylabel() and "%" in right.get_ylabel()
    assert "τ" in left.get_xlabel() and "τ" in right.get_xlabel()
    # Left: one line per kind, chain first, FN ratio in percent by increasing τ (NaN where nothing kept).
    assert [line.get_label() for line in left.get_lines()] == ["chain", "itm"]
    for line, kind in zip(left.get_lines(), ("chain", "itm")):
        ref = df[df["kind"] == kind].sort_values("threshold")
        np.testing.assert_allclose(line.get_xdata(), [0.1, 0.5, 0.9, 1.0])
        np.testing.assert_allclose(line.get_ydata(), ref["fn_ratio"].to_numpy() * 100.0)
        assert np.isnan(line.get_ydata()[0])
    # Right: per kind, a solid "all removed" line and a dashed "true negatives removed" line.
    lines = right.get_lines()
    assert len(lines) == 4
    for kind in ("chain", "itm"):
        ref = df[df["kind"] == kind].sort_values("threshold")
        (solid,) = [ln for ln in lines if ln.get_label().startswith(kind) and ln.get_linestyle() == "-"]
        (dashed,) = [ln for ln in lines if ln.get_label().startswith(kind) and ln.get_linestyle() == "--"]
        assert solid.get_color() == dashed.get_color()
        np.testing.assert_allclose(solid.get_xdata(), [0.1, 0.5, 0.9, 1.0])
        np.testing.assert_allclose(solid.get_ydata(), [100.0, 50.0, 10.0, 0.0])
        np.testing.assert_allclose(
            dashed.get_ydata(), 100.0 * ref["removed_true_negatives"].to_numpy() / ref["negatives"].to_numpy()
        )


def test_fn_after_filter_empty_states_it(tmp_path, captured):
    out = fn_after_filter(_curve().iloc[:0], tmp_path / "empty.png", judge="j", truth="t")
    assert_png(out)
    (ax,) = captured[0].axes
    assert [t.get_text() for t in ax.texts] == [NO_CURVE_MESSAGE]
    assert "j" in ax.get_title() and "t" in ax.get_title()


# --------------------------------------------------------------------------- missed_examples


def _examples(tmp_path, n_readable=3):
    colors = ["red", "green", "blue"]
    paths = []
    for i in range(n_readable):
        p = tmp_path / "imgs" / f"{i}.png"
        p.parent.mkdir(exist_ok=True)
        Image.new("RGB", (16, 12), colors[i % 3]).save(p)
        paths.append(p)
    examples = []
    for i, p in enumerate(paths):
        examples.append(
            {
                "direction": "i2t" if i % 2 == 0 else "t2i",
                "anchor_image": paths[0],
                "anchor_caption": f"anchor caption {i}",
                "negative_image": p,
                "negative_caption": f"negative caption {i}",
                "score": 0.1 + i / 100,
                "judged_image": p,
                "judged_caption": f"a {colors[i]} square",
            }
        )
    return examples


def test_missed_examples_grid_images_and_texts(tmp_path, captured):
    examples = _examples(tmp_path)
    missing = dict(examples[0], judged_image=tmp_path / "imgs" / "does_not_exist.png", judged_caption="a lost image")
    broken = tmp_path / "imgs" / "broken.png"
    broken.write_bytes(b"not a png")
    corrupt = dict(examples[1], judged_image=broken, judged_caption="a corrupt image")
    out = missed_examples(examples + [missing, corrupt], tmp_path / "out" / "missed.png", columns=2)
    assert_png(out)
    (fig,) = captured
    axes = fig.axes
    assert len(axes) == 5  # one cell per example, unused cells removed
    assert all(len(ax.get_images()) == 1 for ax in axes)
    geometry = {ax.get_subplotspec().get_geometry()[:2] for ax in axes}
    assert geometry == {(3, 2)}  # ceil(5 / 2) rows of 2
    # The readable images are shown as loaded.
    np.testing.assert_array_equal(
        axes[0].get_images()[0].get_array(), np.asarray(Image.open(examples[0]["judged_image"]))
    )
    texts = _texts(fig)
    for ex in examples:
        assert any(f"\u201c{ex['judged_caption']}\u201d" in t for t in texts)
        assert any(f"anchor: {ex['anchor_caption']}" in t for t in texts)
    assert any("image→text" in t for t in texts) and any("text→image" in t for t in texts)
    assert any("judge p(match) = 0.10" in t and "true match" in t for t in texts)
    assert "True false negatives the judge missed (low p(match))" in texts
    # Unreadable images become placeholders, not failures.
    for ax in axes[3:]:
        assert [t.get_text() for t in ax.texts if t.get_text() == UNREADABLE_IMAGE_MESSAGE] == [
            UNREADABLE_IMAGE_MESSAGE
        ]
    assert not any(t.get_text() == UNREADABLE_IMAGE_MESSAGE for ax in axes[:3] for t in ax.texts)


def test_missed_examples_fewer_than_columns_and_wrapping(tmp_path, captured):
    (ex,) = _examples(tmp_path, n_readable=1)
    long_caption = "a very long caption " * 8
    missed_examples([dict(ex, judged_caption=long_caption)], tmp_path / "one.png")
    (ax,) = captured[0].axes
    assert ax.get_subplotspec().get_geometry()[:2] == (1, 1)
    (title,) = [t for t in captured[0].findobj(Text) if "very long" in t.get_text()]
    assert all(len(line) <= 40 for line in title.get_text().splitlines())


def test_missed_examples_empty_states_it(tmp_path, captured):
    out = missed_examples([], tmp_path / "none.png")
    assert_png(out)
    (ax,) = captured[0].axes
    assert [t.get_text() for t in ax.texts] == [NO_MISSED_MESSAGE]
    with pytest.raises(ValueError, match="columns"):
        missed_examples([], tmp_path / "bad.png", columns=0)


# --------------------------------------------------------------------------- fn_rate_comparison


def _run(kinds, scale, windows=(0, 1, 2)) -> pd.DataFrame:
    rows = []
    for kind in kinds:
        for window in reversed(windows):
            rate = scale * (0.01 + 0.002 * window) * (2 if kind == "itm" else 1)
            rows.append(
                {
                    "kind": kind,
                    "window": window,
                    "first_step": 50 * window,
                    "last_step": 50 * window + 49,
                    "negatives": 500,
                    "false_negatives": round(rate * 500),
                    "rate": rate,
                }
            )
    return pd.DataFrame(rows)


def test_fn_rate_comparison_lines_per_run(tmp_path, captured):
    runs = {"falcon": _run(["itm", "chain"], 1.0), "uniform": _run(["itm"], 3.0), "nothing": _run([], 1.0)}
    out = fn_rate_comparison(runs, tmp_path / "cmp.png")
    assert_png(out)
    (fig,) = captured
    chain_ax, itm_ax = fig.axes
    assert "false negatives of the used negatives, per run" in _texts(fig)
    assert "chain" in chain_ax.get_title() and "ITM" in itm_ax.get_title()
    assert chain_ax.get_shared_y_axes().joined(chain_ax, itm_ax)
    assert chain_ax.get_ylabel() == "false negatives (%)"
    assert [ln.get_label() for ln in chain_ax.get_lines()] == ["falcon"]
    assert [ln.get_label() for ln in itm_ax.get_lines()] == ["falcon", "uniform"]
    # Same colour for a run in every panel.
    assert chain_ax.get_lines()[0].get_color() == itm_ax.get_lines()[0].get_color()
    for ax, kind in ((chain_ax, "chain"), (itm_ax, "itm")):
        assert ax.get_xlabel() == "training step"
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [ln.get_label() for ln in ax.get_lines()]
        for line in ax.get_lines():
            ref = runs[line.get_label()]
            ref = ref[ref["kind"] == kind].sort_values("window")
            np.testing.assert_allclose(line.get_xdata(), [24.5, 74.5, 124.5])
            np.testing.assert_allclose(line.get_ydata(), ref["rate"].to_numpy() * 100.0)


def test_fn_rate_comparison_empty_states_it(tmp_path, captured):
    out = fn_rate_comparison({"a": _run([], 1.0)}, tmp_path / "empty.png")
    assert_png(out)
    (ax,) = captured[0].axes
    assert [t.get_text() for t in ax.texts] == [NO_RATES_MESSAGE]
    fn_rate_comparison({}, tmp_path / "empty2.png")
    assert (tmp_path / "empty2.png").read_bytes().startswith(PNG_MAGIC)
