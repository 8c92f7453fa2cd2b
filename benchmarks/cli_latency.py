"""Benchmark: how long does the ``falcon`` command take to answer when it runs no stage?

Times, in one run, fresh processes of the commands that only parse, validate and print (help, the recipes,
a bad override), next to ``python -c pass`` as the floor, and prints a markdown table of each one's median
wall time, its ratio to that floor, and its median CPU time (user + system: what a busy neighbour on a shared
machine inflates less than the wall time). The repetitions are interleaved (round 1 of every command, then
round 2, ...) so that such a neighbour slows every command alike. Target: every command within 0.5 s on a
2-core CPU; tests/cli/test_cli_latency.py checks the cause (no torch and friends imported), this script the effect.
The commands run with bytecode caching on (as an installed falcon does), whatever PYTHONDONTWRITEBYTECODE says.

    PYTHONPATH=. .venv/bin/python benchmarks/cli_latency.py

Options: --repeats N (default 7), --falcon PATH (default: the ``falcon`` beside this interpreter).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commands(python: str, falcon: str) -> dict[str, list[str]]:
    """The command lines to time, by the label the table gives them (the first is the floor)."""
    return {
        "python -c pass": [python, "-c", "pass"],
        "falcon --help": [falcon, "--help"],
        "falcon pretrain --help": [falcon, "pretrain", "--help"],
        "falcon recipes list": [falcon, "recipes", "list"],
        "falcon recipes show shapes-demo": [falcon, "recipes", "show", "shapes-demo"],
        "falcon recipes validate": [falcon, "recipes", "validate"],
        "falcon recipes show shapes-demo pretrain.epochz=3": [
            falcon,
            "recipes",
            "show",
            "shapes-demo",
            "pretrain.epochz=3",
        ],
    }


ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
"""The commands' environment: the warm-up round writes the .pyc files that every later round reads."""


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv`` (its output discarded; exit status 2 is the bad override's)."""
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return elapsed, (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs of each command (default 7)")
    parser.add_argument(
        "--falcon",
        default=str(Path(sys.executable).with_name("falcon")),
        help="the console script to time (default: the one beside this interpreter)",
    )
    args = parser.parse_args()

    lines = commands(sys.executable, args.falcon)
    once = {"python -m falcon_cli --help (once)": [sys.executable, "-m", "falcon_cli", "--help"]}
    for argv in [*lines.values(), *once.values()]:  # a warm-up round: the page cache, the .pyc files
        timed(argv)
    times: dict[str, list[tuple[float, float]]] = {label: [] for label in lines}
    for _ in range(args.repeats):
        for label, argv in lines.items():
            times[label].append(timed(argv))
    times.update({label: [timed(argv)] for label, argv in once.items()})

    floor = statistics.median(wall for wall, _ in times["python -c pass"])
    print(
        f"{args.repeats} interleaved runs each, medians ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"load average {os.getloadavg()[0]:.1f} at the end)\n"
    )
    print("| command | wall s | × `python -c pass` | CPU s |")
    print("|---|---:|---:|---:|")
    for label, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"| `{label}` | {wall:.3f} | {wall / floor:.1f} | {cpu:.3f} |")


if __name__ == "__main__":
    main()
