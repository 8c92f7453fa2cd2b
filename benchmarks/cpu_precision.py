"""Does bf16 autocast pay on a CPU with native bf16 matrix units (AVX512-BF16, AMX), and does the run learn the same?
The campaigns' `dense` run in fp32 and in bf16 (``pretrain.runtime.precision``), both at once, one thread each, side by
side on the cores (so both see the same load: ratios from one run, as these machines are noisy).

    # the campaigns' run (phase_sweep's `cpu` budget, uniform, seed 0), 2 epochs, from a sweep's world and encoders:
    PYTHONPATH=. .venv/bin/python benchmarks/cpu_precision.py --out /tmp/precision --worlds /work/evidence/pilots70
    # a tiny world made here (nothing learns): checks the script
    PYTHONPATH=. .venv/bin/python benchmarks/cpu_precision.py --out /tmp/precision-smoke --smoke

Prints and writes (``OUT/precision.json``) every epoch's training seconds under both, their ratio, the training stage's
wall time (the learning-curve evaluations included), each epoch's last losses (ITC, ITM, MLM) and the zero-shot R@1
after each epoch under both, and what each run's manifest says it ran in. bf16 rounds every matrix product's inputs,
so the numbers are not the same; how far they move over a whole run is a question for paired seeds (the campaigns), not
for this pair. Exit 2 where this CPU has no native bf16 (the run would be refused: ``precision=bf16 on the CPU needs
...``).

``--worlds DIR``: a phase_sweep ``--out`` whose ``worlds/dense``, ``world-runs/dense`` and ``unimodal/dense-s0`` are
linked into each run's directory (made here when DIR lacks them: about 2 hours on one thread at the `cpu` budget).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_allocator import (  # noqa: E402
    ALLOCATORS,
    closing_steps,
    epoch_seconds,
    find_library,
    shared_world,
    stage_seconds,
    train,
)
from benchmarks.phase_sweep import BUDGETS, PhaseBudget  # noqa: E402
from benchmarks.scheduler_pilots import link_reused  # noqa: E402
from falcon_cli.runtime.metrics import read_metrics  # noqa: E402
from falcon_cli.runtime.precision import cpu_has_bf16  # noqa: E402

PRECISIONS = ("fp32", "bf16")


def epoch_losses(run: Path) -> list[dict[str, float]]:
    """Every epoch's last logged losses (the step record that closes it)."""
    return [{k: r[k] for k in ("loss", "itc", "itm", "mlm") if k in r} for r in closing_steps(run)]


def zero_shot_r1(run: Path) -> list[float]:
    """The zero-shot i2t R@1 after each evaluated epoch (the learning curve)."""
    return [r["i2t_R@1"] for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "zero_shot"]


def compare(out: Path, budget: PhaseBudget, preload: str) -> dict:
    """fp32 and bf16 side by side: their times, losses and learning curves."""
    for precision in PRECISIONS:
        (out / precision / "runs").mkdir(parents=True, exist_ok=True)
        link_reused(out / precision, out / "shared")
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(
            zip(
                PRECISIONS,
                pool.map(lambda p: train(out / p, budget, preload, (f"pretrain.runtime.precision={p}",)), PRECISIONS),
                strict=True,
            )
        )
    seconds = {p: epoch_seconds(runs[p]) for p in PRECISIONS}
    manifests = {p: json.loads((runs[p] / "manifest.json").read_text()) for p in PRECISIONS}
    return {
        "epoch_seconds": seconds,
        "epoch_ratio": [b / f for f, b in zip(seconds["fp32"], seconds["bf16"], strict=True)],
        "stage_seconds": {p: stage_seconds(runs[p]) for p in PRECISIONS},
        "losses": {p: epoch_losses(runs[p]) for p in PRECISIONS},
        "zero_shot_i2t_R@1": {p: zero_shot_r1(runs[p]) for p in PRECISIONS},
        "ran_in": {p: manifests[p]["stages"]["pretrain"]["result"].get("precision") for p in PRECISIONS},
        "preloaded": preload or None,
        "wall_seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--worlds", type=Path, help="a phase_sweep --out to take the world and encoders from")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="phase_sweep's `quick` budget: a tiny world made here")
    args = parser.parse_args()
    if not cpu_has_bf16():
        print("cpu_precision.py: this CPU has no native bf16 matrix units (AVX512-BF16 or AMX)", file=sys.stderr)
        sys.exit(2)
    budget = replace(BUDGETS["quick" if args.smoke else "cpu"], epochs=args.epochs)
    out = shared_world(args.out.resolve(), budget, args.worlds)
    preload = find_library(ALLOCATORS["tcmalloc"]) or ""  # (as the campaigns run)
    result = compare(out, budget, preload)
    fp32, bf16 = result["epoch_seconds"]["fp32"], result["epoch_seconds"]["bf16"]
    print(
        f"bf16 against fp32, side by side: epochs {', '.join(f'{s:.1f}' for s in bf16)} s against "
        f"{', '.join(f'{s:.1f}' for s in fp32)} s (ratio {', '.join(f'{r:.3f}' for r in result['epoch_ratio'])}); "
        f"training stage {result['stage_seconds']['bf16']:.0f} s against {result['stage_seconds']['fp32']:.0f} s; "
        f"ran in {result['ran_in']['bf16']} and {result['ran_in']['fp32']}"
    )
    for epoch, (a, b) in enumerate(zip(result["losses"]["fp32"], result["losses"]["bf16"], strict=True), start=1):
        print(
            f"epoch {epoch}: loss {b['loss']:.4f} against {a['loss']:.4f} (ITC {b['itc']:.4f} / {a['itc']:.4f}, "
            f"ITM {b['itm']:.4f} / {a['itm']:.4f}, MLM {b['mlm']:.4f} / {a['mlm']:.4f})"
        )
    curves = result["zero_shot_i2t_R@1"]
    print(
        "zero-shot i2t R@1 after each evaluated epoch: "
        f"{', '.join(f'{r:.2f}' for r in curves['bf16'])} against {', '.join(f'{r:.2f}' for r in curves['fp32'])}"
    )
    (out / "precision.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
