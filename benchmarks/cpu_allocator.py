"""Does the memory allocator change a CPU run's speed, or its numbers? The campaigns' `dense` run under glibc's malloc
and under another allocator preloaded (``LD_PRELOAD``), both at once, one thread each, side by side on the cores (so
both see the same load: ratios from one run, as these machines are noisy).

    # the campaigns' run (phase_sweep's `cpu` budget, uniform, seed 0), 2 epochs, from a sweep's world and encoders:
    PYTHONPATH=. .venv/bin/python benchmarks/cpu_allocator.py --out /tmp/alloc --worlds /work/evidence/pilots70
    # a tiny world made here (nothing learns): checks the script
    PYTHONPATH=. .venv/bin/python benchmarks/cpu_allocator.py --out /tmp/alloc-smoke --smoke

Each allocator in ``--allocators`` that this machine has (``apt install libtcmalloc-minimal4 libjemalloc2`` on
Debian) gets its own pair of runs. For each pair it prints and writes (``OUT/allocators.json``) every epoch's training
seconds under both, their ratio, the training stage's wall time (the learning-curve evaluations included), what each
run's manifest says was preloaded (``host.preloaded``), and whether the two runs' numbers are bitwise the same
(:mod:`benchmarks.same_numbers`: every logged loss and shared result). Exit 1 if any pair's numbers differ.

``--worlds DIR``: a phase_sweep ``--out`` whose ``worlds/dense``, ``world-runs/dense`` and ``unimodal/dense-s0`` are
linked into each run's directory (made here when DIR lacks them: about 2 hours on one thread at the `cpu` budget).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.phase_sweep import BUDGETS, METHODS, PhaseBudget, generate_world, prepare  # noqa: E402
from benchmarks.same_numbers import differences  # noqa: E402
from benchmarks.scheduler_pilots import link_reused  # noqa: E402
from benchmarks.shapes_sweep import falcon  # noqa: E402
from falcon_cli.runtime.metrics import read_metrics  # noqa: E402

ALLOCATORS = {"tcmalloc": "libtcmalloc_minimal.so.4", "jemalloc": "libjemalloc.so.2"}
"""Allocator name -> the shared library preloaded for it."""
PRESET, METHOD, SEED = "dense", "uniform", 0


def find_library(soname: str) -> str | None:
    """The path of ``soname`` as the dynamic linker would find it (``ldconfig -p``), or None."""
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")  # (not on a user's PATH)
    if ldconfig is None:
        return None
    listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=False).stdout
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.split(" ")[0] == soname and Path(path).exists():
            return path
    return None


def closing_steps(run: Path) -> list[dict]:
    """Each epoch's last step record (a record of no ``kind``: the losses, ``elapsed_s``), epoch by epoch."""
    last: dict[int, dict] = {}
    for record in read_metrics(run / "metrics.jsonl"):
        if record.get("kind") is None and "loss" in record:
            last[record["epoch"]] = record
    return [last[e] for e in sorted(last)]


def epoch_seconds(run: Path) -> list[float]:
    """Every epoch's training seconds: its last step record's ``elapsed_s`` (which starts again with each epoch)."""
    return [record["elapsed_s"] for record in closing_steps(run)]


def stage_seconds(run: Path) -> float:
    """The pretrain stage's wall time (its start to its end in the manifest: the learning curve included)."""
    stage = json.loads((run / "manifest.json").read_text())["stages"]["pretrain"]
    return (datetime.fromisoformat(stage["end"]) - datetime.fromisoformat(stage["start"])).total_seconds()


def train(out: Path, budget: PhaseBudget, preload: str, overrides: tuple[str, ...] = ()) -> Path:
    """The campaigns' uniform run in ``out`` under ``preload`` ('' = glibc's malloc), one thread, from scratch, with
    ``overrides`` after the budget's (``pretrain.runtime.precision=bf16``)."""
    run = out / "runs" / PRESET / f"{METHOD}-s{SEED}"
    recipe, extra = METHODS[METHOD]
    falcon(
        "run",
        "--recipe",
        recipe,
        "--run-dir",
        str(run),
        "--overwrite",
        "stages=[data, pretrain]",
        *budget.run_overrides(PRESET, out, SEED),
        *extra,
        *overrides,
        log=out / "train.log",
        threads=1,
        preload=preload,
    )
    return run


def shared_world(out: Path, budget: PhaseBudget, worlds: Path | None) -> Path:
    """``out`` with the `dense` world and seed 0's unimodal encoders in ``out/shared``: linked from ``worlds`` (a
    phase_sweep ``--out``) where it has them, else made there; each pair of runs links them in turn."""
    shared = out / "shared"
    (shared / "logs").mkdir(parents=True, exist_ok=True)
    if worlds is not None:
        link_reused(shared, worlds.resolve())
    generate_world(PRESET, shared, budget, threads=2)  # (each skipped where ``worlds`` has it)
    prepare(PRESET, SEED, shared, budget, threads=2)
    return out


def compare(out: Path, budget: PhaseBudget, name: str, library: str) -> dict:
    """glibc's malloc and ``library`` side by side; their times, and whether their numbers are the same."""
    arms = {"glibc": "", name: library}
    for arm in arms:
        (out / name / arm / "runs").mkdir(parents=True, exist_ok=True)
        link_reused(out / name / arm, out / "shared")
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(arms, pool.map(lambda a: train(out / name / a, budget, arms[a]), arms), strict=True))
    base, other = (epoch_seconds(runs[a]) for a in arms)
    manifests = {a: json.loads((runs[a] / "manifest.json").read_text()) for a in arms}
    return {
        "allocator": name,
        "library": library,
        "epoch_seconds": {"glibc": base, name: other},
        "epoch_ratio": [o / b for b, o in zip(base, other, strict=True)],
        "stage_seconds": {a: stage_seconds(runs[a]) for a in arms},
        "preloaded": {a: manifests[a]["stages"]["pretrain"]["host"].get("preloaded") for a in arms},
        "differences": differences(runs["glibc"], runs[name]),
        "wall_seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--worlds", type=Path, help="a phase_sweep --out to take the world and encoders from")
    parser.add_argument("--allocators", nargs="+", choices=sorted(ALLOCATORS), default=sorted(ALLOCATORS))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="phase_sweep's `quick` budget: a tiny world made here")
    args = parser.parse_args()
    budget = replace(BUDGETS["quick" if args.smoke else "cpu"], epochs=args.epochs)
    found = {name: find_library(ALLOCATORS[name]) for name in args.allocators}
    if not any(found.values()):
        sys.exit(f"cpu_allocator.py: none of {', '.join(ALLOCATORS[n] for n in args.allocators)} is installed")
    out = shared_world(args.out.resolve(), budget, args.worlds)
    results = []
    for name, library in found.items():
        if library is None:
            print(f"{name}: {ALLOCATORS[name]} is not installed here; skipped")
            continue
        result = compare(out, budget, name, library)
        results.append(result)
        ratios = ", ".join(f"{r:.3f}" for r in result["epoch_ratio"])
        glibc, other = result["epoch_seconds"]["glibc"], result["epoch_seconds"][name]
        print(
            f"{name} against glibc, side by side: epochs {', '.join(f'{s:.1f}' for s in other)} s against "
            f"{', '.join(f'{s:.1f}' for s in glibc)} s (ratio {ratios}); training stage "
            f"{result['stage_seconds'][name]:.0f} s against {result['stage_seconds']['glibc']:.0f} s; preloaded "
            f"{result['preloaded'][name]} against {result['preloaded']['glibc']}; numbers "
            + ("bitwise the same" if not result["differences"] else f"DIFFER: {result['differences'][:3]}")
        )
    (out / "allocators.json").write_text(json.dumps(results, indent=1) + "\n")
    sys.exit(1 if any(r["differences"] for r in results) else 0)


if __name__ == "__main__":
    main()
