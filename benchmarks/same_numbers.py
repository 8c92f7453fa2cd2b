"""Do two runs have bitwise the same numbers? Every logged training step's losses (``metrics.jsonl``) and every result
file they share (``results/*.json``, ``audit/summary.json``), compared value by value.

    PYTHONPATH=. .venv/bin/python benchmarks/same_numbers.py RUN_A RUN_B

What a speed change must leave alone (issue 67: cutting a `dense` run's per-epoch evaluation must not move its
numbers): prints each difference (at most 20) and exits 1 if there is one, else one line and 0. Timing keys
(seconds, pairs per second, memory), the paths that name each run's own directory, and the learning-curve records
(``kind: zero_shot``, which a run evaluated less often has fewer of) are not compared; where both runs have a curve
record of an epoch, it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMING = ("elapsed_s", "pairs_per_s", "peak_memory_mib", "seconds", "time", "start", "end")
WHERE = ("checkpoint", "run", "path", "weights")
"""Keys that name a run's own directory, not a number it computed."""


def numbers(value):
    """``value`` without its timing and location keys (at any depth)."""
    if isinstance(value, dict):
        return {k: numbers(v) for k, v in value.items() if k not in TIMING + WHERE}
    if isinstance(value, list):
        return [numbers(v) for v in value]
    return value


def step_records(run: Path) -> dict[tuple, dict]:
    """``{(kind, epoch, step): record}`` of a run's ``metrics.jsonl`` (a record written again counts once, the
    later)."""
    from falcon_cli.runtime.metrics import read_metrics

    return {(r.get("kind"), r.get("epoch"), r.get("step")): r for r in read_metrics(run / "metrics.jsonl")}


def differences(a: Path, b: Path) -> list[str]:
    out = []
    records_a, records_b = step_records(a), step_records(b)
    steps = lambda records: {k for k in records if k[0] != "zero_shot"}  # noqa: E731
    if steps(records_a) != steps(records_b):
        out.append(
            f"metrics.jsonl: other records ({len(steps(records_a))} vs {len(steps(records_b))} outside the curve)"
        )
    for key in sorted(set(records_a) & set(records_b), key=str):
        ra, rb = records_a[key], records_b[key]
        for name in sorted(set(ra) | set(rb)):
            if name not in TIMING and ra.get(name) != rb.get(name):
                out.append(f"metrics.jsonl {key}: {name} {ra.get(name)!r} vs {rb.get(name)!r}")
    for relative in sorted({p.relative_to(a) for p in (a / "results").glob("*.json")} | {Path("audit/summary.json")}):
        if not (a / relative).exists() or not (b / relative).exists():
            continue
        ja, jb = (numbers(json.loads((run / relative).read_text())) for run in (a, b))
        if ja != jb:
            keys = sorted(k for k in set(ja) | set(jb) if ja.get(k) != jb.get(k))
            out.append(f"{relative}: {', '.join(keys)} differ")
    return out


def main() -> None:
    a, b = (Path(p) for p in sys.argv[1:3])
    found = differences(a, b)
    for line in found[:20]:
        print(line)
    if found:
        raise SystemExit(f"{len(found)} difference(s) between {a} and {b}")
    print(f"bitwise the same: every logged step's losses and every shared result of {a} and {b}")


if __name__ == "__main__":
    main()
