#!/usr/bin/env bash
# One call on a lent GPU machine: install the carried wheels, run one part of the GPU work, and leave its
# results in $OUT as at most 8 files (what such a call brings back). The machine starts bare each time and a
# session's device time is short (30 minutes), so each call does one whole thing under a time limit.
#
# Before the first call, on the development machine (the GPU machine has no package index; its image has
# torch, transformers, timm, pandas, h5py, typer and rich, but not these):
#   PIP_FIND_LINKS= python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl open_clip_torch ftfy wcwidth faiss-cpu pydantic \
#       pydantic-core annotated-types typing-inspection typing_extensions eccv-caption
# (pydantic pins one pydantic-core: `unzip -p .whl/pydantic-2*.whl '*/METADATA' | grep core` must name the one in .whl.)
#
# Then, as the device tool's command, with carry [".whl"]:
#   bash benchmarks/device_call.sh suite 340                  # the whole suite, 15 workers (~6 min on an H100)
#   bash benchmarks/device_call.sh speed 540 ceiling base-grit base-falcon-reuse-eager compose-ops
#   bash benchmarks/device_call.sh tests 150 tests/stages/test_pretrain.py::test_kill_and_resume_is_exact
#   (issue 62, the step captured whole, four calls: benchmarks/README.md, "The step captured whole")
#   bash benchmarks/device_call.sh speed 560 ceiling base-grit-step base-falcon-reuse-step
#   bash benchmarks/device_call.sh speed 560 ceiling base-falcon-reuse-step-overlap base-falcon-recompute-step-overlap
#   bash benchmarks/device_call.sh speed 560 ceiling base-falcon-recompute-step tiny-falcon-step
#   bash benchmarks/device_call.sh speed 560 ceiling blip2-grit-step siglip-grit-step
#   bash benchmarks/device_call.sh phase 540 --presets coco-like --only falcon falcon-margin --seeds 1 2 3 4 --jobs 8 --threads 2
#   (the positive margin with q on the log-rank scale, five paired seeds beside the coco-like ledger's:)
#   bash benchmarks/device_call.sh phase 560 --presets coco-like --only falcon-margin-top --seeds 0 1 2 3 4 --jobs 5 --threads 3
#   (on that scale, rewards that need not charge a scene's true near misses: the ITM head's judgement, the oracle's)
#   bash benchmarks/device_call.sh phase 560 --presets coco-like --only falcon-itm-expected-top falcon-oracle-top --seeds 1 2 3 4 --jobs 8 --threads 2
#   (issue 59's dense rows: five paired seeds of mafa, glofnd, diht, falcon and falcon-margin, ten runs a call; SRCL's
#   auxiliary is the same seed's uniform run, which must still have its checkpoint, so srcl trains in the call that
#   trains its uniform, the sweep waiting for each uniform before its srcl; carry runs/phase-web/worlds/dense and
#   runs/phase-web/unimodal:)
#   (glofnd ran in issue 60; mafa's five stopped at epoch 30 of 36 in 780 s beside it: alone, five at a time)
#   bash benchmarks/device_call.sh phase 560 --presets dense --only mafa --seeds 0 1 2 3 4 --jobs 5 --threads 3
#   bash benchmarks/device_call.sh phase 560 --presets dense --only diht falcon-margin --seeds 0 1 2 3 4 --jobs 10 --threads 1
#   bash benchmarks/device_call.sh phase 560 --presets dense --only falcon --seeds 0 1 2 3 4 --jobs 5 --threads 3
#   bash benchmarks/device_call.sh phase 560 --presets dense --only uniform srcl --seeds 0 1 2 --jobs 6 --threads 2
#   bash benchmarks/device_call.sh phase 560 --presets dense --only uniform srcl --seeds 3 4 --jobs 4 --threads 4
# (phase: benchmarks/phase_sweep.py --out runs/phase-web with those arguments; carry the world and its unimodal
# encoders too, e.g. runs/phase-web/worlds/dense and runs/phase-web/unimodal; the run directories come back without
# their checkpoints, one archive per method, for `phase_sweep.py --out runs/phase-web --collect` here.)
# The second argument is the part's time limit in seconds; keep it under the call's own (600 s at most).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:?suite, speed, tests or phase}; limit=${2:?seconds}; shift 2
out=${OUT:?set OUT: the folder whose files come back from the device machine}
case "$what" in suite|speed|tests|phase) ;; *) echo "unknown part '$what': suite, speed, tests or phase" >&2; exit 2 ;; esac
# it installs into the machine's own Python: never on a development machine
command -v nvidia-smi > /dev/null || { echo "device_call.sh is for the lent GPU machine (no nvidia-smi here)" >&2; exit 2; }
export PYTHONUNBUFFERED=1 FALCON_PROGRESS=0 PYTHONPATH=.  # (the benchmarks import each other as a package)
export PYTHONFAULTHANDLER=1  # (a process that dies in native code, as tiny-falcon-graphs did, still prints its Python stack)
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl > "$out/setup.log" 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >> "$out/setup.log" 2>&1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  python3 -c "import torch, transformers, timm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'timm', timm.__version__)"
} >> "$out/setup.log" 2>&1
case "$what" in
  suite)  # -v: each result is printed as it lands, so a suite stopped at its limit still names its failures
    timeout "$limit" python3 -m pytest -v -n 15 --dist load -p no:cacheprovider -rf --tb=short --timeout 240 \
        > "$out/pytest.log" 2>&1
    echo "pytest exit $? (124: stopped at ${limit} s)"
    grep -E "\] (FAILED|ERROR)|^(FAILED|ERROR)" "$out/pytest.log" | sort -u | head -30
    tail -n 3 "$out/pytest.log" ;;
  tests)  # named tests with their whole tracebacks
    timeout "$limit" python3 -m pytest -q -n 4 -p no:cacheprovider --tb=long "$@" > "$out/pytest.log" 2>&1
    echo "pytest exit $?"; tail -c 6000 "$out/pytest.log" ;;
  speed)  # pretrain_speed.py parts; profiles and metrics come back as one archive
    timeout "$limit" python3 benchmarks/pretrain_speed.py --out /tmp/speed --only "$@" > "$out/speed.log" 2>&1
    echo "pretrain_speed exit $?"
    cp /tmp/speed/speed.json /tmp/speed/speed.md "$out/" 2>/dev/null
    (cd /tmp/speed && tar czf "$out/runs.tgz" runs/*/profile runs/*/metrics.jsonl runs/*/manifest.json 2>/dev/null)
    grep -v "pretrain --recipe" "$out/speed.log" | tail -n 25 ;;
  phase)  # a part of the phase diagram; what a run wrote comes back even when the limit stops it mid-run
    timeout "$limit" python3 benchmarks/phase_sweep.py --out runs/phase-web "$@" > "$out/phase.log" 2>&1
    echo "phase_sweep exit $? (124: stopped at ${limit} s)"
    # one archive per method, without checkpoints and per-epoch embedding caches (evaluation and audit ran here);
    # an archive over 15 MB (a file that large does not come back) is split into one per seed half
    tar czf "$out/phase-logs.tgz" runs/phase-web/logs
    for method in $(ls runs/phase-web/runs/*/ 2>/dev/null | sed -n 's/-s[0-9]*$//p' | sort -u); do
      runs=(runs/phase-web/runs/*/"$method"-s*)
      tar czf "$out/phase-$method.tgz" --exclude=checkpoints --exclude=embeddings "${runs[@]}"
      if [ "$(stat -c %s "$out/phase-$method.tgz")" -gt 15000000 ]; then
        half=$(( (${#runs[@]} + 1) / 2 )); rm "$out/phase-$method.tgz"
        tar czf "$out/phase-$method-a.tgz" --exclude=checkpoints --exclude=embeddings "${runs[@]:0:half}"
        tar czf "$out/phase-$method-b.tgz" --exclude=checkpoints --exclude=embeddings "${runs[@]:half}"
      fi
    done
    ls -la "$out"; tail -n 20 "$out/phase.log" ;;
esac
