"""benchmarks/softmax_ulp.py: its patch moves every ``F.softmax`` output up by exactly one ulp (and only when asked),
its comparison counts the weight tensors that differ, and bad input is refused with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import softmax_ulp  # noqa: E402

from tests.conftest import TINY_SHAPES_RUN, run_cli  # noqa: E402

CHECK = """
import torch, torch.nn.functional as F
torch.manual_seed(0)
x = torch.randn(7, 33) * 5
moved, plain = F.softmax(x, dim=1), torch.softmax(x, dim=1)
print(torch.equal(moved, torch.nextafter(plain, torch.full_like(plain, 2.0))), torch.equal(moved, plain))
"""


@pytest.mark.parametrize("flag, expected", [("1", "True False"), ("0", "False True")])
def test_the_patch_moves_softmax_one_ulp_up_only_when_asked(tmp_path, flag, expected):
    (tmp_path / "sitecustomize.py").write_text(softmax_ulp.SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FALCON_SOFTMAX_ULP": flag}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected


def _checkpoint(run: Path, step: int, tensors: dict[str, torch.Tensor]) -> None:
    folder = run / "checkpoints" / f"{step:08d}"
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))


def test_differing_tensors_counts_per_step_against_a_plain_comparison(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    w = {"w": torch.ones(3), "v": torch.zeros(2, 2)}
    _checkpoint(a, 5, w)
    _checkpoint(b, 5, {k: v.clone() for k, v in w.items()})
    _checkpoint(a, 10, w)
    _checkpoint(b, 10, {"w": torch.tensor([1.0, 1.25, 1.0]), "v": torch.zeros(2, 2)})
    _checkpoint(a, 15, w)  # (one run only: not compared)
    (a / "checkpoints" / "latest").write_text("00000015")
    assert softmax_ulp.differing_tensors(a, b) == {
        "5": {"differ": 0, "tensors": 2, "largest": 0.0},
        "10": {"differ": 1, "tensors": 2, "largest": 0.25},
    }


def test_a_directory_without_a_config_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(SystemExit, match=r"softmax_ulp: .*config\.yaml: no such file"):
        softmax_ulp.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_softmax_ulp_reaches_uniform_and_not_the_control(tmp_path):
    """The premise of docs/results.md's reading of the kind of CPU's effect, on the tiny shapes world: the control
    reads ``F.softmax`` only through ITM's draws (an ulp does not move them here), uniform through its soft
    targets."""
    base = tmp_path / "base"
    done = run_cli("run", "--recipe", "shapes-uniform", "--run-dir", str(base), *TINY_SHAPES_RUN, "pretrain.epochs=1")
    assert done.returncode == 0, done.stderr
    assert softmax_ulp.main([str(base), "--epochs", "1", "--out", str(tmp_path / "out")]) == 0
    arms = json.loads((tmp_path / "out" / "summary.json").read_text())["arms"]
    assert arms["control"]["by_step"] and all(s["differ"] == 0 for s in arms["control"]["by_step"].values())
    assert all(s["differ"] > 0 for s in arms["uniform"]["by_step"].values())
