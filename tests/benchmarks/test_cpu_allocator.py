"""benchmarks/cpu_allocator.py: the allocator a sweep's falcon processes get, how its times are read, its smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import cpu_allocator as bench
from benchmarks.shapes_sweep import falcon_env
from falcon_cli.artifacts.provenance import host_info
from tests.conftest import REPO


def smoke_run(script: str, out) -> subprocess.CompletedProcess:
    """``benchmarks/SCRIPT --out OUT --smoke`` as a user runs it, from OUT."""
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--out", str(out), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=out,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_find_library_finds_what_the_linker_would_and_nothing_else():
    libc = bench.find_library("libc.so.6")
    assert libc is not None and os.path.exists(libc) and libc.endswith("/libc.so.6")
    assert bench.find_library("libnot-a-library.so.7") is None
    assert bench.find_library("libc.so") != libc  # (a prefix is not the name)


def test_a_sweeps_falcon_process_gets_the_callers_preload_or_the_one_asked_for(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert "LD_PRELOAD" not in falcon_env(1)
    assert falcon_env(2, "/lib/libtcmalloc_minimal.so.4")["LD_PRELOAD"] == "/lib/libtcmalloc_minimal.so.4"
    monkeypatch.setenv("LD_PRELOAD", "/lib/libjemalloc.so.2")
    monkeypatch.setenv("SOMETHING_ELSE", "1")
    env = falcon_env(1)
    assert env["LD_PRELOAD"] == "/lib/libjemalloc.so.2" and env["OMP_NUM_THREADS"] == "1"
    assert "SOMETHING_ELSE" not in env  # (nothing else of the caller's)
    assert "LD_PRELOAD" not in falcon_env(1, "")  # ('': glibc's malloc, whatever the caller preloads)


def test_the_manifest_records_what_was_preloaded(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:/opt/libx.so")
    assert host_info()["preloaded"] == ["libtcmalloc_minimal.so.4", "libx.so"]
    monkeypatch.delenv("LD_PRELOAD")
    assert host_info()["preloaded"] == []


def test_epoch_seconds_are_each_epochs_last_step_record(tmp_path):
    records = [
        {"step": 0, "epoch": 0, "loss": 5.0, "elapsed_s": 1.0},
        {"step": 10, "epoch": 0, "loss": 4.0, "elapsed_s": 40.5},
        {"step": 10, "epoch": 0, "kind": "zero_shot", "elapsed_s": 99.0},  # (not a step: skipped)
        {"step": 11, "epoch": 1, "loss": 3.9, "elapsed_s": 3.0},
        {"step": 20, "epoch": 1, "loss": 3.5, "elapsed_s": 38.25},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert bench.epoch_seconds(tmp_path) == [40.5, 38.25]


@pytest.mark.slow  # (two pairs of tiny runs: about a minute on 2 cores)
@pytest.mark.skipif(not any(map(bench.find_library, bench.ALLOCATORS.values())), reason="no tcmalloc or jemalloc")
def test_the_smoke_run_preloads_each_allocator_and_finds_the_numbers_the_same(tmp_path):
    done = smoke_run("cpu_allocator.py", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "allocators.json").read_text())
    assert results
    for result in results:
        name = result["allocator"]
        assert result["preloaded"] == {"glibc": [], name: [bench.ALLOCATORS[name]]}
        assert result["differences"] == [] and len(result["epoch_ratio"]) == 2
        assert "bitwise the same" in done.stdout


def test_the_manifest_records_the_cpu_model_and_a_cpu_rows_machine_names_it(tmp_path):
    """Another CPU model trains other numbers from the same commit, seed and config: a CPU run's row says which."""
    from benchmarks.phase_sweep import machine
    from falcon_cli.artifacts.provenance import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu\n\n" * 2)
    assert cpu_model(info) == "AMD EPYC"
    assert cpu_model(tmp_path / "none") and host_info()["cpu"]  # (the platform's field, or "unknown")

    def manifest(host: dict, device: str) -> dict:
        return {"stages": {"pretrain": {"host": host, "result": {"device": device, "precision": "fp32"}}}}

    assert machine(manifest({"cpus": 2, "gpus": [], "cpu": "AMD EPYC"}, "cpu")) == "2 CPU cores, AMD EPYC (cpu, fp32)"
    assert machine(manifest({"cpus": 2, "gpus": []}, "cpu")) == "2 CPU cores (cpu, fp32)"  # (a run from before)
    on_gpu = manifest({"cpus": 16, "gpus": ["NVIDIA H200"], "cpu": "AMD EPYC"}, "cuda:0")
    assert machine(on_gpu) == "16 CPU cores, NVIDIA H200 (cuda:0, fp32)"  # (the GPU's numbers, whatever the CPU)
