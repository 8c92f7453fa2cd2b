"""benchmarks/step_operators.py: it counts a real training step's operators, phase by phase."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO


def test_counts_each_phase_of_a_training_step():
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "step_operators.py"),
            "--model",
            "albef-tiny",
            "--precision",
            "fp32",
            "--batch",
            "3",
            "--text-tokens",
            "9",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    counts = {
        name: (int(ops.replace(",", "")), int(kernels.replace(",", "")))
        for name, ops, kernels in re.findall(
            r"^\s+(\w+)\s+([\d,]+) operators,\s+([\d,]+) with a kernel", proc.stdout, re.M
        )
    }
    assert set(counts) == {"forward", "backward", "optimizer", "step"}
    assert all(0 < kernels < ops for ops, kernels in counts.values())
    assert counts["step"][0] == sum(counts[p][0] for p in ("forward", "backward", "optimizer"))
    # albef-tiny's forward runs dozens of linear layers: hundreds of operators, not a handful
    assert counts["forward"][0] > 300 and counts["backward"][0] > 300
    assert "albef-tiny, fp32, 9 text tokens" in proc.stdout
