"""benchmarks/long_runs.sh: a campaign starts from a clone pinned at its commit; bad input is one line, exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from benchmarks.cpu_allocator import find_library
from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "long_runs.sh"


def long_runs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_bad_input_is_one_line_and_makes_nothing(tmp_path):
    root = tmp_path / "evidence"
    for args, words in (
        ((), "usage: benchmarks/long_runs.sh"),
        (("sweep", "HEAD", str(root)), "no campaign sweep: pilots, followup, dense70, candidate or fair-dense"),
        (("dense70", "0000000", str(root)), "0000000 is not a commit of"),
        (("dense70,candidate", "0000000", str(root)), "0000000 is not a commit of"),  # (before any campaign starts)
        (("dense70,sweep", "HEAD", str(root)), "no campaign sweep:"),
        (("dense70,", "HEAD", str(root)), "dense70,: a campaign's name is missing (commas separate the names)"),
        ((",dense70", "HEAD", str(root)), "a campaign's name is missing"),
        (("", "HEAD", str(root)), "a campaign's name is missing"),
        (("dense70@0000000", "HEAD", str(root)), "0000000 is not a commit of"),
        (("fair-dense,dense70@0000000", "HEAD", str(root)), "0000000 is not a commit of"),  # (before the first)
        (("fair-dense,dense70@", "HEAD", str(root)), "dense70@: the commit after @ is missing"),
        (("sweep@HEAD", "HEAD", str(root)), "no campaign sweep:"),
    ):
        done = long_runs(*args)
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not root.exists()


def checkout_with_a_fake_python(tmp_path: Path) -> Path:
    """A clone of this repository with this tree's script, whose python records what it was asked (no training)."""
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(checkout)], check=True)
    (checkout / "benchmarks" / "long_runs.sh").write_text(SCRIPT.read_text())  # (this tree's script, uncommitted)
    (checkout / ".venv" / "bin").mkdir(parents=True)
    fake = checkout / ".venv" / "bin" / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'echo "python $PWD $PYTHONPATH $*"\n'
        'echo "session $(ps -o sid= -p $$ | tr -d " ") group $(cat /proc/self/autogroup 2>/dev/null)"\n'
        'echo "preload [$LD_PRELOAD]"\n'
    )
    fake.chmod(0o755)
    return checkout


def cpuinfo(tmp_path: Path, vendor: str = "AuthenticAMD", flags: str = "fpu sse avx512f avx512_bf16") -> str:
    """A /proc/cpuinfo of two cores of one kind (the campaigns check the CPU they train on)."""
    path = tmp_path / f"cpuinfo-{vendor}-{len(flags)}"
    core = f"processor\t: {{}}\nvendor_id\t: {vendor}\nmodel name\t: a CPU\nflags\t\t: {flags}\n\n"
    path.write_text(core.format(0) + core.format(1))
    return str(path)


def test_a_campaign_trains_only_on_the_kind_of_cpu_its_rows_were_trained_on(tmp_path):
    """Another CPU model trains other numbers (fair-dense's uniform seed 2 on an AMD EPYC: 41 of 47 measurements
    differ from its Intel row): a campaign on another kind logs why it skips, and the chain goes on. fair-dense
    trains on either of its two kinds (a seed on the second brings its bases there), on no third."""
    checkout = checkout_with_a_fake_python(tmp_path)
    root = tmp_path / "evidence"
    intel = cpuinfo(tmp_path, "GenuineIntel", "fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    for info, trains, skips in (
        (cpuinfo(tmp_path), ["fair-dense", "dense70", "pilots"], []),  # (an AMD EPYC with AVX512-BF16)
        (intel, ["fair-dense", "pilots"], ["dense70"]),  # (an Intel Xeon with AMX)
        (cpuinfo(tmp_path, "GenuineIntel", "fpu avx512f"), ["pilots"], ["fair-dense", "dense70"]),  # (no AMX)
    ):
        shutil.rmtree(root, ignore_errors=True)
        done = subprocess.run(
            ["bash", str(checkout / "benchmarks" / "long_runs.sh"), "fair-dense,dense70,pilots", "HEAD", str(root)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, "LONG_RUNS_CPUINFO": info},
        )
        assert done.returncode == 0, done.stderr
        for campaign in trains:
            log = (root / f"{campaign}.log").read_text()
            assert "skipped" not in log and "benchmarks/" in log and log.rstrip().endswith(f"{campaign} done"), log
        for campaign in skips:
            log = (root / f"{campaign}.log").read_text()
            assert log.count("\n") == 1 and f"{campaign} skipped: its rows were trained on a CPU of kind" in log, log
            assert "python" not in log


def test_the_allocator_is_found_however_long_the_library_list(tmp_path):
    """ldconfig's list read to its end: a reader that left at the match got ldconfig killed by SIGPIPE, and under
    pipefail and set -e the campaign ended before its first log line (at random, where the list fits a pipe)."""
    checkout = checkout_with_a_fake_python(tmp_path)
    tools = tmp_path / "tools"
    tools.mkdir()
    libc = find_library("libc.so.6")  # (a library that loads, standing in for tcmalloc)
    ldconfig = tools / "ldconfig"  # (the match first, then far more than a pipe holds)
    ldconfig.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "\tlibtcmalloc_minimal.so.4 (libc6,x86-64) => {libc}"\n'
        'for i in $(seq 20000); do echo "\tlibother$i.so.1 (libc6,x86-64) => /lib/libother$i.so.1"; done\n'
    )
    ldconfig.chmod(0o755)
    root = tmp_path / "evidence"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run(
        ["bash", str(checkout / "benchmarks" / "long_runs.sh"), "dense70", "HEAD", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PATH": f"{tools}:{env['PATH']}", "LONG_RUNS_CPUINFO": cpuinfo(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    log = (root / "dense70.log").read_text()
    assert f"allocator {libc} " in log.splitlines()[0] and f"preload [{libc}]" in log and "dense70 done" in log, log


def test_the_clone_is_pinned_and_the_dense_world_is_linked_not_made_twice(tmp_path):
    """The campaign's python is replaced by one that records what it was asked (no training here)."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    root = tmp_path / "evidence"
    for part in ("worlds/dense", "world-runs/dense", "unimodal/dense-s0", "unimodal/dense-s3"):
        (root / "pilots70" / part).mkdir(parents=True)
    checkout = checkout_with_a_fake_python(tmp_path)
    done = subprocess.run(
        ["bash", str(checkout / "benchmarks" / "long_runs.sh"), "dense70", head.strip()[:9], str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, "LONG_RUNS_CPUINFO": cpuinfo(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    clone = root / f"falcon-{head.strip()[:7]}"
    pinned = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert pinned == head
    log = (root / "dense70.log").read_text()
    assert f"python {clone} . benchmarks/phase_sweep.py --out {root}/five-bf16 --budget cpu --presets dense" in log
    assert log.rstrip().endswith("dense70 done")
    # its own session (where the kernel groups the CPU by session, nice alone would not yield to the shell's work),
    # niced as a group where the kernel has groups; the log says how to stop it
    session = int(log.split("session ")[1].split()[0])
    assert session != os.getsid(0) and f"(to stop it and its runs: kill -- -{session})" in log.splitlines()[0]
    if Path("/proc/self/autogroup").exists():
        assert "nice 10" in log.split("session ")[1].splitlines()[0], log
    # tcmalloc preloaded where the machine has it (faster, the same numbers: benchmarks/cpu_allocator.py)
    tcmalloc = find_library("libtcmalloc_minimal.so.4") or ""
    assert f"preload [{tcmalloc}]" in log and f"allocator {tcmalloc or 'glibc'}" in log.splitlines()[0], log
    for part in ("worlds/dense", "world-runs/dense", "unimodal/dense-s0", "unimodal/dense-s3"):
        assert (root / "five-bf16" / part).is_symlink(), part
    libc = find_library("libc.so.6")
    again = subprocess.run(  # (a restart: the clone and links are reused)
        ["bash", str(checkout / "benchmarks" / "long_runs.sh"), "dense70", head.strip(), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "LD_PRELOAD": libc,
            "LONG_RUNS_CPUINFO": cpuinfo(tmp_path),
        },  # (the caller's LD_PRELOAD kept)
    )
    assert again.returncode == 0, again.stderr
    log = (root / "dense70.log").read_text()
    assert log.count("dense70 done") == 2 and f"preload [{libc}]" in log and f"allocator {libc} " in log
    parent = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD~1"], capture_output=True, text=True).stdout
    chain = f"dense70,candidate@{parent.strip()[:9]}"  # (the candidate at a commit of its own)
    candidate = subprocess.run(  # (chained: dense70 a third time, then the candidate's five seeds in both worlds)
        ["bash", str(checkout / "benchmarks" / "long_runs.sh"), chain, head.strip(), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LONG_RUNS_CPUINFO": cpuinfo(tmp_path)},
    )
    assert candidate.returncode == 0, candidate.stderr
    dense70, log = (root / "dense70.log").read_text(), (root / "candidate.log").read_text()
    assert dense70.count("dense70 done") == 3 and log.rstrip().endswith("candidate done")
    first = [line for line in dense70.splitlines() if "(to stop it" in line][-1]
    assert first.split("kill -- -")[1] == log.splitlines()[0].split("kill -- -")[1]  # (one session: one kill)
    assert f"dense70 at {head[:7]}," in first
    assert log.splitlines()[0].split()[1:4] == ["candidate", "at", parent[:7] + ","]
    assert f"python {root}/falcon-{parent[:7]} . benchmarks/phase_sweep.py" in log and "candidate@" not in log
    for preset, arms in (("coco-like", "grit uniform"), ("dense", "grit q05")):
        # (each reads and writes the bf16 ledger of the checkout it was started from, not the clone's: on main)
        ledger = f"--ledger {checkout}/docs/results/five_bf16_results.csv"
        assert f"--presets {preset} {ledger} --only falcon-rank-oracle-quadratic-w1 {arms} --seeds 0 1 2 3 4" in log
        # (two 1-thread runs; every arm in bf16, which a CPU with native bf16 trains about 1.5x faster)
        assert f"{arms} --seeds 0 1 2 3 4 --set eval_every=3 precision=bf16 --jobs 2 --threads 1\n" in log
    dense = root / "fair-dense" / "runs" / "dense"  # (two finished MAFA runs, one replayed already, one unfinished)
    for seed in (2, 3, 4):
        (dense / f"mafa-rule-s{seed}" / "results").mkdir(parents=True)
        if seed != 4:
            (dense / f"mafa-rule-s{seed}" / "results" / "retrieval.json").write_text("{}")
    (root / "fair-dense" / "mafa-decisions" / "s3").mkdir(parents=True)
    (root / "fair-dense" / "mafa-decisions" / "s3" / "decisions.json").write_text("{}")
    fair = subprocess.run(  # (issue 67's campaign: the page's ledger on main says what is left to train)
        ["bash", str(checkout / "benchmarks" / "long_runs.sh"), "fair-dense", head.strip(), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "LONG_RUNS_CPUINFO": cpuinfo(tmp_path, "GenuineIntel", "avx512f amx_tile")},
    )
    assert fair.returncode == 0, fair.stderr
    log = (root / "fair-dense.log").read_text()
    assert f"--jobs 2 --threads 1 --ledger {checkout}/docs/results/fair_dense_results.csv\n" in log, log
    # then the finished MAFA runs' decisions replayed (those not replayed yet) and their Con-Ds probed
    fair_runs = f"{root}/fair-dense"
    assert f"mafa_decisions.py {dense}/mafa-rule-s2 --out {fair_runs}/mafa-decisions/s2\n" in log, log
    assert "mafa-rule-s3 --out" not in log and "mafa-rule-s4" not in log
    for seed in (2, 3):
        probe = f"itm_probe.py {dense}/uniform-cpu-s{seed} --out {fair_runs}/itm-probe/uniform-cpu-s{seed}.json\n"
        assert probe in log, log
    assert log.rstrip().endswith("fair-dense done")
