"""Which arms a one-ulp change in ``F.softmax`` reaches: the control (no GRIT consistency term) or uniform (with it).

Another kind of CPU trains other numbers for uniform (GRIT's ITC consistency term at 0.2) and the same numbers, to
the last logged digit, for the control (the term at 0): issue 67's seeds 2-4, Intel Xeons with AMX against an AMD
EPYC (docs/results.md, *The kind of CPU's own effect*). The consistency term's soft targets are ``F.softmax`` of the
similarities; the control computes them too but weights them by 0, and reads ``F.softmax`` elsewhere only through
ITM's multinomial draws. So a softmax that rounds differently on the two kinds would give exactly that pattern.
This script tests the premise on one machine: it trains both arms from a run's resolved config for a few epochs,
each as is and with every output of ``F.softmax`` moved up by one ulp (``torch.nextafter``, through a
``sitecustomize`` module on the child's ``PYTHONPATH``), and counts the weight tensors that differ at each
checkpoint. It cannot say which operation differs between the kinds; it says whether a softmax-level rounding change
can reach each arm.

    PYTHONPATH=. .venv/bin/python benchmarks/softmax_ulp.py runs/fair-dense/runs/dense/uniform-c0-s2 \\
        --epochs 2 --out runs/softmax-ulp

(four runs of ``--epochs`` epochs each, one after the other, on one thread; about 12 minutes for 2 `dense`
epochs.) Writes ``OUT/summary.json`` and prints one line per arm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.shapes_sweep import falcon_env  # noqa: E402

SITECUSTOMIZE = """\
import os
if os.environ.get("FALCON_SOFTMAX_ULP") == "1":  # (benchmarks/softmax_ulp.py)
    import torch
    import torch.nn.functional as F
    _softmax = F.softmax
    def softmax(*args, **kwargs):
        out = _softmax(*args, **kwargs)
        return torch.nextafter(out, torch.full_like(out, 2.0))
    F.softmax = softmax
"""
"""The child's ``sitecustomize``: with ``FALCON_SOFTMAX_ULP=1``, every ``F.softmax`` output moves up by one ulp.
(The package reads ``F.softmax`` at call time, so the patch reaches the ITC's soft targets and ITM's draws.)"""

ARMS = {"control": 0.0, "uniform": 0.2}
"""The arms: GRIT's ITC consistency weight of each (the control drops the term; uniform keeps GRIT's 0.2)."""


def train(config: Path, run_dir: Path, weight: float, ulp: bool, epochs: int, site: Path) -> None:
    """One run of ``config`` (a run's resolved ``config.yaml``) for ``epochs`` epochs at consistency ``weight``,
    with ``F.softmax`` moved one ulp up where ``ulp``; one thread, no evaluation before the end."""
    env = {  # (the sweeps' own environment, with the patch's folder first on the path)
        **falcon_env(threads=1),
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
        "FALCON_SOFTMAX_ULP": "1" if ulp else "0",
    }
    command = [
        sys.executable, "-m", "falcon_cli", "run", "--recipe", str(config), "--run-dir", str(run_dir), "--overwrite",
        f"pretrain.epochs={epochs}", f"pretrain.losses.itc_consistency_weight={weight}", "pretrain.eval.every=1000",
    ]  # fmt: skip
    log = run_dir.with_suffix(".log")
    with open(log, "w") as out:
        if subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"softmax_ulp: the run in {run_dir} failed; its output is in {log}")


def differing_tensors(a: Path, b: Path) -> dict[str, dict]:
    """Per checkpoint step both runs saved: how many model tensors differ, of how many, and the largest difference."""
    from safetensors.torch import load_file

    steps = sorted({p.name for p in (a / "checkpoints").iterdir()} & {p.name for p in (b / "checkpoints").iterdir()})
    result = {}
    for step in (s for s in steps if s.isdigit()):
        x = load_file(a / "checkpoints" / step / "model.safetensors")
        y = load_file(b / "checkpoints" / step / "model.safetensors")
        gaps = [(x[k].double() - y[k].double()).abs().max().item() for k in x]
        result[str(int(step))] = {"differ": sum(g > 0 for g in gaps), "tensors": len(gaps), "largest": max(gaps)}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory whose config.yaml the arms train from")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    parser.add_argument("--out", type=Path, required=True, help="where the four runs and summary.json go")
    args = parser.parse_args(argv)
    config = args.run / "config.yaml"
    if not config.is_file():
        raise SystemExit(f"softmax_ulp: {config}: no such file (a run directory written by falcon run)")
    if args.epochs < 1:
        raise SystemExit(f"softmax_ulp: --epochs {args.epochs}: must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"config": str(config), "epochs": args.epochs, "arms": {}}
    with tempfile.TemporaryDirectory() as site:
        Path(site, "sitecustomize.py").write_text(SITECUSTOMIZE)
        for arm, weight in ARMS.items():
            for ulp in (False, True):
                train(config, args.out / f"{arm}{'-ulp' if ulp else ''}", weight, ulp, args.epochs, Path(site))
            summary["arms"][arm] = {
                "consistency_weight": weight,
                "by_step": differing_tensors(args.out / arm, args.out / f"{arm}-ulp"),
            }
            steps = summary["arms"][arm]["by_step"]
            print(
                f"{arm} (consistency weight {weight:g}): "
                + "; ".join(f"step {s}: {d['differ']} of {d['tensors']} tensors differ (largest {d['largest']:.3g})"
                            for s, d in steps.items())
            )  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
