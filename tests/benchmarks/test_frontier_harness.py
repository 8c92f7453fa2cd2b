"""benchmarks/frontier_harness.py: its anchors' picks written out plainly, and one short run through its CLI."""

from __future__ import annotations

import sys

import pandas as pd
import torch

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import frontier_harness as harness  # noqa: E402

from falcon_cli.sampling.quantile import nearest_rank  # noqa: E402
from falcon_cli.sampling.scheduler import level_grid  # noqa: E402


def test_each_anchors_picks_are_the_nearest_rank_of_its_sorted_row():
    g = torch.Generator().manual_seed(0)
    image = torch.nn.functional.normalize(torch.randn(36, 8, generator=g), dim=1)
    text = torch.nn.functional.normalize(image + 0.5 * torch.randn(36, 8, generator=g), dim=1)
    table = torch.rand(36, 36, generator=g) < 0.25
    anchors = harness.frontier_anchors(image, text, lambda idx: table[idx][:, idx], 12, levels=4, held_out=1 / 3)
    perm = torch.randperm(36, generator=torch.Generator().manual_seed(0))
    assert anchors.held_out.tolist() == [False] * 24 + [True] * 12
    for s in range(3):
        members = perm[12 * s : 12 * s + 12]
        sim = image[members] @ text[members].T + text[members] @ image[members].T
        fn = table[members][:, members] | table[members][:, members].T
        for a in range(12):
            others = sorted((j for j in range(12) if j != a), key=lambda j: (float(sim[a, j]), -j))
            for k, q in enumerate(level_grid(4)):
                assert anchors.level_fn[12 * s + a, k] == float(fn[a, others[nearest_rank(q, 11)]])
            for k, q in enumerate(harness.FIXED):
                assert anchors.fixed_fn[12 * s + a, k] == float(fn[a, others[nearest_rank(q, 11)]])
            assert float(anchors.density[12 * s + a]) == float(fn[a].sum() - int(fn[a, a])) / 11


def test_a_short_run_writes_its_table_and_report_block(tmp_path):
    report = tmp_path / "results.md"
    report.write_text("# Results\n")
    assert (
        harness.main(
            [
                "--synthetic",
                "--updates",
                "20",
                "--seeds",
                "0",
                "1",
                "--credits",
                "levels",
                "chosen",
                "--out",
                str(tmp_path / "out"),
                "--report",
                str(report),
            ]
        )
        == 0
    )
    frame = pd.read_csv(tmp_path / "out" / "frontier.csv")
    assert len(frame) == 4 and set(frame.credit) == {"levels", "chosen"}
    assert ((frame.gap_points - 100 * (frame.fn_rate - frame.frontier_fn_rate)).abs() < 1e-2).all()
    text = report.read_text()
    assert harness.BEGIN in text and "| levels | 2 | 2 |" in text and "| chosen | 2 | 2 |" in text
