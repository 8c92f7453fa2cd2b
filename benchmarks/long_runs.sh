#!/usr/bin/env bash
# The open issues' long CPU runs, each from a clone pinned at one commit outside the work tree (so a refactor of the
# work tree cannot change or break a run half-way), niced, resumable: run the same line again after a stop and every
# finished part is skipped, an interrupted run resumes from its last checkpoint. Start or restart one campaign:
#
#   benchmarks/long_runs.sh CAMPAIGN COMMIT ROOT      # e.g. benchmarks/long_runs.sh dense70 9ba6ec3 /work/evidence
#   benchmarks/long_runs.sh fair-dense,candidate COMMIT ROOT   # one after the other (the next starts when one ends)
#   benchmarks/long_runs.sh fair-dense,candidate@1e71084 e3dd650 ROOT   # a campaign's own commit after its name
#
# CAMPAIGN:
#   pilots      issue 70: the four pre-registered scheduler pilots in `coco-like`, then in `dense`
#   followup    issue 70: the follow-up pilots alone, in `dense` (FOLLOW_UPS in benchmarks/phase_sweep.py)
#   dense70     issue 70: paper-exact FALCON (falcon-paper-rate), GRIT and q = 0.5 in `dense`, seeds 0-4, 36 epochs
#   candidate   issue 70: the follow-up that passed both pilots (falcon-rank-oracle-quadratic-w1), seeds 0-4, 36 epochs:
#               against GRIT and uniform in `coco-like`, against GRIT and q = 0.5 in `dense` (dense70's GRIT and q = 0.5
#               runs are the same runs: the two campaigns share ROOT/five-bf16, so run them one after the other)
#               Both train in bf16 (every arm of them alike; the evaluations stay fp32), which a CPU with native bf16
#               trains about 1.5x faster (benchmarks/cpu_precision.py). Their commit must have it and phase_sweep.py's
#               --ledger (ddb5519 or later): their rows go to docs/results/five_bf16_results.csv of this checkout.
#   fair-dense  issue 67: the tuning runs, then every arm of benchmarks/fair_dense.py, seeds 0-4, less what the page's
#               ledger (docs/results/fair_dense_results.csv of this checkout) records; its commit must have --ledger;
#               then each finished MAFA run's decisions replayed (mafa_decisions.py) and its Con-D probed (itm_probe.py)
#
# A campaign trains only on the kind of CPU its rows were trained on (candidate and dense70: an AMD EPYC), since
# another kind trains other numbers from the same commit and seed; on another kind it logs why and the chain goes on
# (LONG_RUNS_CPUINFO: a cpuinfo file to read instead of /proc/cpuinfo, for tests). fair-dense trains on an Intel Xeon
# with AMX or an AMD EPYC: its rows say which, and a seed trained on the second kind trains its bases there too
# (fair_dense.py's eval_plan; its commit must have that: 2026-12-04 or later).
#
# ROOT gets the clone (ROOT/falcon-COMMIT), the runs (ROOT/pilots70, ROOT/five-bf16, ROOT/fair-dense[-tune]) and a log
# per campaign (ROOT/CAMPAIGN.log). The python is this checkout's .venv (make install): the clone comes first on
# PYTHONPATH, so the clone's falcon_cli runs. The worlds and unimodal encoders the pilots made in ROOT/pilots70 are
# linked into the others when they start (what exists then; a campaign makes what is still missing itself). Collecting
# the results into docs/ is each benchmark's own --collect (see its docstring). Campaigns chained with commas run in
# order in one session (one kill stops them all); one that fails is logged and the next starts all the same.
set -euo pipefail
if [ $# -ne 3 ]; then
    echo "usage: benchmarks/long_runs.sh pilots|followup|dense70|candidate|fair-dense[@COMMIT][,...] COMMIT ROOT" >&2
    exit 2
fi
campaign=$1 commit=$2 root=$(realpath -m "$3")
case ",$campaign," in
    *,,*) echo "long_runs.sh: $campaign: a campaign's name is missing (commas separate the names)" >&2; exit 2 ;;
esac
IFS=, read -ra chain <<<"$campaign"
for one in "${chain[@]}"; do
    case ${one%%@*} in
        pilots | followup | dense70 | candidate | fair-dense) ;;
        *) echo "long_runs.sh: no campaign ${one%%@*}: pilots, followup, dense70, candidate or fair-dense" >&2; exit 2 ;;
    esac
done
# Where the kernel shares the CPU between sessions first (sched_autogroup, the default of most distributions), `nice`
# ranks a process only within its own session: a campaign started from a shell took half the cores from that
# shell's work, niced or not. So the campaign runs in a session of its own, and that session's group is niced too
# (`make test` beside a campaign's two runs, 2026-12-02: 24 min 7 s before, 14 min 51 s with the group niced, 7 min
# on idle cores); its log's first line says how to stop it (its process group).
if [ "${LONG_RUNS_OWN_SESSION:-}" != 1 ]; then
    LONG_RUNS_OWN_SESSION=1 exec setsid --wait bash "$0" "$@"
fi
{ echo 10 >/proc/self/autogroup; } 2>/dev/null || true
here=$(cd "$(dirname "$0")/.." && pwd)
python=$here/.venv/bin/python
[ -x "$python" ] || { echo "long_runs.sh: $python is missing: run make install in $here first" >&2; exit 2; }
own_commit() {  # the commit a chain's campaign runs at: its own after @, else the one given for all
    if [[ $1 == *@* ]]; then echo "${1#*@}"; else echo "$commit"; fi
}
for one in "${chain[@]}"; do  # (every commit checked before the first campaign starts)
    own=$(own_commit "$one")
    [ -n "$own" ] || { echo "long_runs.sh: $one: the commit after @ is missing" >&2; exit 2; }
    git -C "$here" rev-parse --verify --quiet "$own^{commit}" >/dev/null ||
        { echo "long_runs.sh: $own is not a commit of $here" >&2; exit 2; }
done
if [ ${#chain[@]} -gt 1 ]; then  # a chain: each campaign in turn, in this session (LONG_RUNS_OWN_SESSION is set)
    mkdir -p "$root"
    for one in "${chain[@]}"; do
        # (the status read before $(date) runs: a command substitution resets $?)
        bash "$0" "${one%%@*}" "$(own_commit "$one")" "$root" ||
            { status=$?; echo "$(date -u +%FT%TZ) ${one%%@*} failed (exit $status)" >>"$root/${one%%@*}.log"; }
    done
    exit 0
fi
commit=$(own_commit "$campaign") campaign=${campaign%%@*}
full=$(git -C "$here" rev-parse --verify "$commit^{commit}")
clone=$root/falcon-${full:0:7}
mkdir -p "$root"
if [ ! -d "$clone" ]; then
    git clone --quiet "$here" "$clone.partial"
    git -C "$clone.partial" checkout --quiet "$full"
    mv "$clone.partial" "$clone"
fi
[ "$(git -C "$clone" rev-parse HEAD)" = "$full" ] || { echo "long_runs.sh: $clone is not at $full" >&2; exit 2; }

link_worlds() {  # the pilots' worlds, world runs and every seed's encoders, linked into $1 (what it lacks)
    local source
    for source in "$root"/pilots70/worlds/* "$root"/pilots70/world-runs/* "$root"/pilots70/unimodal/*; do
        local target=$1/${source#"$root"/pilots70/}
        if [ -e "$source" ] && [ ! -e "$target" ]; then
            mkdir -p "$(dirname "$target")"
            ln -s "$source" "$target"
        fi
    done
}

# A machine may not outlive its session, so each campaign reads the ledger on main (this checkout's docs/results/, not
# the clone's) and trains only what it lacks: fair_dense.py's the page's rows; the bf16 campaigns' a ledger of their
# own, which phase_sweep.py writes back as runs finish; the pilots' their table (collect both and commit them before
# the session ends).
bf16_ledger=$here/docs/results/five_bf16_results.csv
pilots=$here/docs/results/scheduler_pilots.csv  # (the pilots' table: a pilot it holds is not trained again)

# Two runs at a time on one thread each: on this 2-core machine two 1-thread coco-like runs took 107-112 s an epoch each
# side by side, one 2-thread run 66 s alone (1.2x the runs per hour; 2026-12-02).
parallel=(--jobs 2 --threads 1)
# The 36-epoch runs' learning curve every third epoch, as fair_dense.py's (10% of a run; an evaluation does not change
# the training: benchmarks/README.md, "A `dense` run's CPU time").
curve=(--set eval_every=3)

# tcmalloc where it is installed (apt install libtcmalloc-minimal4), unless LD_PRELOAD says otherwise: the same run
# side by side under it and under glibc's malloc trained 7-12% faster, with bitwise the same numbers (2026-12-02;
# benchmarks/cpu_allocator.py). The sweeps pass LD_PRELOAD on to every falcon process; each run's manifest records it.
# (awk reads ldconfig's list to its end: had it exited at the match, ldconfig could be killed by SIGPIPE mid-write, and
# under pipefail and set -e that ended the campaign before its first log line, at random)
if [ -z "${LD_PRELOAD:-}" ]; then
    LD_PRELOAD=$(PATH=$PATH:/sbin:/usr/sbin ldconfig -p 2>/dev/null |
        awk '$1 == "libtcmalloc_minimal.so.4" && !found { print $NF; found = 1 }')
fi
export LD_PRELOAD
allocator=${LD_PRELOAD:-"glibc's malloc (tcmalloc trains 7-12% faster: apt install libtcmalloc-minimal4)"}

run() { (cd "$clone" && nice -n 10 env PYTHONPATH=. "$python" "$@") >>"$root/$campaign.log" 2>&1; }

# The CPU a campaign's rows were trained on. The same commit, seed and config trains other numbers on another CPU
# model: fair-dense's uniform seed 2, trained again on an AMD EPYC (2026-12-04), differed from its row (trained, and
# reproduced to four decimals, on Intel Xeons with AMX) in 41 of its 47 measurements, ITC R@1 by 1.3 points. A paired
# comparison keeps each seed's arms on one kind of CPU, so a campaign trains only on its own kind and logs why it
# skips on another (the chain goes on to the next). The kind: the vendor, and AMX where the CPU has it.
cpu_kind() {
    awk -F': ' '/^vendor_id/ && !v { v = $2 } /^flags/ && !f { f = " " $2 " " }
        END { print v (f ~ / amx_tile / ? " amx" : "") }' "${LONG_RUNS_CPUINFO:-/proc/cpuinfo}"
}
case $campaign in  # (the kinds, separated by commas)
    fair-dense) wanted="GenuineIntel amx,AuthenticAMD" ;;  # (Intel: every CPU row before 2026-12-04; then AMD seeds)
    candidate | dense70) wanted="AuthenticAMD" ;;  # (their first rows, 2026-12-04; the pilots judge runs alone)
    *) wanted="" ;;
esac
kind=$(cpu_kind)
if [ -n "$wanted" ] && [[ ",$wanted," != *",$kind,"* ]]; then
    echo "$(date -u +%FT%TZ) $campaign skipped: its rows were trained on a CPU of kind '$wanted', this one is '$kind'" \
        "(another kind of CPU trains other numbers, and a seed's arms must share one)" >>"$root/$campaign.log"
    exit 0
fi

group=$(ps -o pgid= -p $$ | tr -d ' ')  # (the session's: a chain's campaigns share it)
echo "$(date -u +%FT%TZ) $campaign at ${full:0:7}, allocator $allocator (to stop it and its runs: kill -- -$group)" \
    >>"$root/$campaign.log"
case $campaign in
    pilots)
        # (coco-like first: the dense pilots' rows are in docs/results/scheduler_pilots.csv already)
        pilot_args=(--out "$root/pilots70" "${parallel[@]}" --keep-rows "$pilots")
        run benchmarks/scheduler_pilots.py --presets coco-like "${pilot_args[@]}"
        run benchmarks/scheduler_pilots.py --presets dense "${pilot_args[@]}"
        ;;
    followup)
        followups=$(cd "$clone" && PYTHONPATH=. "$python" -c \
            "from benchmarks.phase_sweep import FOLLOW_UPS; print(' '.join(FOLLOW_UPS))")
        # shellcheck disable=SC2086  # (the names: one word each)
        run benchmarks/scheduler_pilots.py --out "$root/pilots70" --presets dense --only $followups "${parallel[@]}" \
            --keep-rows "$pilots"
        ;;
    dense70)
        link_worlds "$root/five-bf16"
        run benchmarks/phase_sweep.py --out "$root/five-bf16" --budget cpu --presets dense --ledger "$bf16_ledger" \
            --only falcon-paper-rate grit q05 --seeds 0 1 2 3 4 "${curve[@]}" precision=bf16 "${parallel[@]}"
        ;;
    candidate)
        link_worlds "$root/five-bf16"
        run benchmarks/phase_sweep.py --out "$root/five-bf16" --budget cpu --presets coco-like --ledger "$bf16_ledger" \
            --only falcon-rank-oracle-quadratic-w1 grit uniform --seeds 0 1 2 3 4 "${curve[@]}" precision=bf16 \
            "${parallel[@]}"
        run benchmarks/phase_sweep.py --out "$root/five-bf16" --budget cpu --presets dense --ledger "$bf16_ledger" \
            --only falcon-rank-oracle-quadratic-w1 grit q05 --seeds 0 1 2 3 4 "${curve[@]}" precision=bf16 \
            "${parallel[@]}"
        ;;
    fair-dense)
        link_worlds "$root/fair-dense"
        run benchmarks/fair_dense.py --out "$root/fair-dense" --tune-out "$root/fair-dense-tune" "${parallel[@]}" \
            --ledger "$here/docs/results/fair_dense_results.csv"
        # Then, while the runs' directories are here (a machine may not outlive its session): each finished MAFA run's
        # decisions replayed and scored against the oracle (about 20 minutes a seed), and its Con-D's ITM head probed
        # (the same seed's uniform run); fair_dense.py --collect reads the replays, the page quotes the probes.
        for mafa in "$root"/fair-dense/runs/dense/mafa-rule-s*; do
            seed=${mafa##*-s}
            [[ $seed =~ ^[0-9]+$ ]] && [ -e "$mafa/results/retrieval.json" ] || continue
            replay=$root/fair-dense/mafa-decisions/s$seed probe=$root/fair-dense/itm-probe/uniform-cpu-s$seed.json
            [ -e "$replay/decisions.json" ] || run benchmarks/mafa_decisions.py "$mafa" --out "$replay" ||
                echo "$(date -u +%FT%TZ) mafa-rule seed $seed: the replay failed" >>"$root/$campaign.log"
            mkdir -p "$(dirname "$probe")"
            [ -e "$probe" ] || run benchmarks/itm_probe.py "$root/fair-dense/runs/dense/uniform-cpu-s$seed" \
                --out "$probe" || echo "$(date -u +%FT%TZ) uniform-cpu seed $seed: the probe failed" >>"$root/$campaign.log"
        done
        ;;
esac
echo "$(date -u +%FT%TZ) $campaign done" >>"$root/$campaign.log"
