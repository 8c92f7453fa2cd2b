"""Rank and world size from the environment (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK), joining the process
group, and what keeps a multi-process job from hanging: a watchdog per rank (heartbeats in the job's store, an error
any rank publishes there) and rank-0-only work whose outcome every rank learns (docs/cluster.md, "A lost node" and
"When rank 0 refuses")."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from rich.markup import escape

from falcon_cli.errors import FalconError, Preempted, Refused, causes
from falcon_cli.runtime.console import make_console

DEFAULT_TIMEOUT_S = 600.0
"""How long any collective may wait when the caller names no bound (``pretrain.runtime.dist_timeout``'s default)."""


def rank() -> int:
    """Global rank of this process (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Number of processes in the job (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0, the only rank that draws progress bars and writes artifacts."""
    return rank() == 0


def local_rank() -> int:
    """Rank of this process on its node (selects the CUDA device)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def init_distributed(device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Join the process group torchrun set up (NCCL on CUDA, gloo on CPU); False when single-process.

    ``timeout_s`` (``pretrain.runtime.dist_timeout``) bounds every collective, and this rank's watchdog starts: it keeps
    a heartbeat in the job's store, and makes the process exit with one line when another rank is lost or publishes an
    error (:func:`surface`), even when this rank is stuck inside a collective. A no-op when already joined."""
    import torch
    import torch.distributed as dist

    global _timeout_s
    if world_size() <= 1:
        return False
    if not dist.is_initialized():
        if device_type == "cuda":
            if local_rank() >= torch.cuda.device_count():
                # NCCL needs one GPU per process; two ranks on one GPU would fail deep inside NCCL.

                raise FalconError(
                    f"torchrun started local rank {local_rank()} but this node has "
                    f"{torch.cuda.device_count()} CUDA device(s); use --nproc_per_node "
                    f"<= {torch.cuda.device_count()}, or set the stage's device=cpu (e.g. pretrain.runtime.device=cpu) "
                    "for gloo processes"
                )
            torch.cuda.set_device(local_rank())
        from datetime import timedelta

        dist.init_process_group(
            backend="nccl" if device_type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s)
        )
        _timeout_s = timeout_s
        _start_watch(timeout_s)
        warning = restart_store_warning(os.environ)
        if warning is not None and rank() == 0:
            make_console(stderr=True).print(f"[yellow]warning:[/] {escape(warning)}")
    return True


def restart_store_warning(env) -> str | None:
    """The line to warn with when torchrun may restart workers (``--max-restarts``) over the store its rendezvous
    shares with them, None otherwise. torchrun keeps that store across restarts and each agent counts its own
    restarts, so a restarted worker can read the previous attempt's addresses from it and fail to connect, or with
    NCCL connect to a stale id (pytorch/pytorch#135712, #167288; it failed this way in
    tests/runtime/test_cluster_faults.py). ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in torchrun's environment gives
    every attempt a store of its own."""
    if int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) <= 0 or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return (
        "torchrun --max-restarts with the rendezvous store shared with the workers: a restarted job can read the "
        "previous attempt's addresses from it and fail to reconnect (pytorch/pytorch#135712); export "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun (docs/cluster.md)"
    )


def barrier() -> None:
    """Wait for every rank (no-op when single-process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def on_rank_zero(work: Callable[[], dict]) -> dict:
    """Run ``work()`` on rank 0 while the other ranks wait; every rank leaves when it is done, and when it raises,
    every rank raises the same: rank 0 its own exception, the others a :class:`FalconError` (a :class:`Refused` where
    rank 0's was one) with rank 0's line. Returns ``work``'s result on rank 0 and ``{}`` elsewhere (the data stage,
    embed, search spaces, the audit, opening the run directory).

    The other ranks wait on the job's store, not in a collective: rank 0's work may take longer than
    ``pretrain.runtime.dist_timeout`` (embedding a dataset), and the watchdog notices if rank 0 is lost meanwhile. Call
    it on every rank, in the same order."""
    job = _job
    if job is None:  # single-process, or no watchdog (then a barrier, as before)
        if not is_main_process():
            barrier()
            return {}
        try:
            return work()
        finally:
            barrier()
    job.calls += 1
    key = f"rank0/{job.calls}"
    if not is_main_process():
        _wait_for_key(job, key)
        return {}
    try:
        result = work()
    except BaseException as exc:
        surface(exc)  # (the others raise rank 0's line)
        raise
    job.store().set(key, "ok")
    return result


def _wait_for_key(job: "_Job", key: str) -> None:
    """Poll the store until ``key`` is set; raise the error a rank publishes meanwhile. (Polling ``check`` rather
    than a blocking ``wait``: a wait that times out logs a warning, and this may wait for hours.)"""
    store, pause = job.store(), 0.05
    while not store.check([key]):
        published = _published(store)
        if published is not None:
            raise _as_error(published)
        time.sleep(pause)
        pause = min(pause * 1.5, job.interval)


def all_gather_cat(tensor):
    """Concatenate ``tensor`` from every rank along dim 0, in rank order (same shape on every rank)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def where() -> str:
    """This process for a message: ``node N (host, rank R)`` (N: torchrun's node rank, GROUP_RANK)."""
    return f"node {os.environ.get('GROUP_RANK', '?')} ({socket.gethostname()}, rank {rank()})"


def gather_objects(obj: Any) -> list:
    """``obj`` from every rank, in rank order (``[obj]`` when single-process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, obj)
    return parts


def broadcast_object(obj: Any, src: int) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def flat_items(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{"a.b.c": leaf}`` (lists are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    items: dict[str, Any] = {}
    for key, inner in value.items():
        items.update(flat_items(inner, f"{prefix}.{key}" if prefix else str(key)))
    return items


def launch_digest(launch: dict) -> str:
    """sha256 of a launch description (its JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(launch, sort_keys=True, default=str).encode()).hexdigest()


def first_difference(mine: dict, theirs: dict) -> str | None:
    """The first key (dotted, sorted) whose value differs between two nested dicts, with both values."""
    a, b = flat_items(mine), flat_items(theirs)
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            return f"{key} is {_short(a.get(key, '<unset>'))} there and {_short(b.get(key, '<unset>'))} on rank 0"
    return None


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_same_launch(launch: dict) -> None:
    """Every rank was started with the same ``launch`` (the resolved config, the run directory, the command and its
    options), else every rank raises :class:`Refused` with one line naming the first rank that differs from rank 0
    (node, host, rank) and its first differing key. A collective: call it on every rank, before anything is written
    (or where a :class:`Refused` puts the run's record back). No-op when single-process."""
    if world_size() <= 1:
        return
    everyone = gather_objects({"where": where(), "digest": launch_digest(launch)})
    odd = [r for r, e in enumerate(everyone) if e["digest"] != everyone[0]["digest"]]
    if not odd:
        return
    # (only now, and only two ranks' worth: the first differing key)
    reference, other = broadcast_object(launch, 0), broadcast_object(launch, odd[0])
    key = first_difference(other, reference)
    more = f" (and {len(odd) - 1} more rank(s))" if len(odd) > 1 else ""
    raise Refused(
        f"{everyone[odd[0]]['where']}{more} was launched with another config than rank 0 on "
        f"{everyone[0]['where']}: {key}; launch every node with the same recipe and overrides "
        "(nothing in the run directory was changed)"
    )


def check_shared_file(path: str | Path, what: str, *, wait_s: float = 20.0) -> None:
    """Every rank sees the file rank 0 has just written at ``path`` byte for byte, else every rank raises
    :class:`Refused` naming the first rank that does not: on a cluster the run directory must be on a filesystem
    every node mounts at the same path (rank 0 writes what every rank reads back: checkpoints on ``--resume``,
    search spaces, embeddings). Waits up to ``wait_s`` for a network filesystem's cache to catch up first.
    A collective; no-op when single-process."""
    if world_size() <= 1:
        return
    path = Path(path)
    expected = broadcast_object(_file_digest(path) if is_main_process() else None, 0)
    problem = None if is_main_process() else _sees(path, expected, wait_s)
    everyone = gather_objects({"where": where(), "problem": problem})
    bad = [e for e in everyone if e["problem"] is not None]
    if bad:
        more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
        raise Refused(
            f"{bad[0]['where']}{more} cannot see the {what} rank 0 wrote: {path} {bad[0]['problem']}; "
            f"every node must see the {what} at the same path: put --run-dir on a filesystem all nodes "
            "share (docs/cluster.md)"
        )


def _file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _sees(path: Path, expected: str | None, wait_s: float) -> str | None:
    """None when ``path`` holds the bytes whose digest is ``expected``, else why not (after waiting ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        digest = _file_digest(path)
        if digest == expected:
            return None
        if time.monotonic() >= deadline:
            return "does not exist here" if digest is None else "holds other contents here"
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))


def shutdown() -> None:
    """Leave the process group if one was joined, and stop this rank's watchdog (its heartbeat says it is done, so
    no other rank takes it for lost)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _stop_watch()


# --- A lost rank, and an error on one rank, reach every rank ----------------------------------------------------
#
# Each rank keeps a heartbeat in the job's store (a counter and where it stands: stage, epoch, step) and a daemon
# thread that (a) writes it every few seconds, (b) watches the ring successor's heartbeat (each rank watches one
# other: O(world) store traffic), (c) watches one error key any rank may publish. A rank whose command fails
# publishes its line there (:func:`surface`, first writer wins) before it leaves. The others then either fail in
# their next collective (gloo: the peer's connection closes), surface it and print that line, or, stuck (NCCL, a
# collective that never returns), their watchdog prints it and ends the process. A collective that fails for want
# of a peer is explained by the heartbeats: a rank whose counter does not move is lost; a store that cannot be
# reached means the rendezvous host (node 0, whose torchrun agent holds the store) is gone.

_ERROR = "error"
"""The store key of the first error a rank published: JSON ``{"line", "kind", "code", "rank"}``."""
_EXIT_CODE = 2
"""Exit status of a rank that stops for another rank's error or a lost rank (a :class:`FalconError`'s)."""


class _Job:
    """This process's place in the job: who every rank is, the store keys, the watchdog's timings and state."""

    def __init__(self, roster: list[dict], token: str, timeout_s: float, address: tuple[str, int] | None, shared):
        self.roster, self.rank, self.timeout_s = roster, rank(), timeout_s
        self.prefix = f"falcon/{token}"
        # Heartbeats every `interval` (a twentieth of the bound, 0.5-5 s); a rank silent for half the bound is lost
        # (before NCCL's own watchdog, at the bound, would end the process without a word).
        self.interval = min(5.0, max(0.5, timeout_s / 20))
        self.stale_after = max(timeout_s / 2, 3 * self.interval)
        # How long the main thread gets to surface a published error itself (a gloo collective fails at once).
        self.exit_grace = max(3 * self.interval, 3.0)
        self.address, self._shared = address, shared
        self._store = None
        self.progress: dict[str, Any] = {}
        self.calls, self.beats = 0, 0
        self.surfacing = False
        self.lock = threading.Lock()  # (the main thread and the watchdog: one of them prints the line)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def client(self, timeout_s: float):
        """A store connection of its own (the watchdog's must never queue behind the main thread's), under this
        job's prefix."""
        from datetime import timedelta

        import torch.distributed as dist

        if self.address is None:
            return dist.PrefixStore(self.prefix, self._shared)
        tcp = dist.TCPStore(
            self.address[0],
            self.address[1],
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        return dist.PrefixStore(self.prefix, tcp)

    def store(self):
        """The main thread's store connection."""
        if self._store is None:
            self._store = self.client(max(self.stale_after, 10.0))
        return self._store

    def beat(self, store, done: bool = False) -> None:
        """Write this rank's heartbeat: a counter that moves with every beat, and where the rank stands."""
        self.beats += 1
        store.set(f"beat/{self.rank}", json.dumps({"n": self.beats, "done": done, **self.progress}))


_job: _Job | None = None
_timeout_s = DEFAULT_TIMEOUT_S


def collective_timeout_s() -> float:
    """The bound on any collective this command waits (``pretrain.runtime.dist_timeout``), for a process group made
    later (``dist.new_group(timeout=...)``: torch gives those gloo's 30 minutes otherwise)."""
    return _timeout_s


def note_stage(name: str | None) -> None:
    """Tell the watchdog which stage runs now (its lines say where the job stopped); resets the step."""
    if _job is not None:
        _job.progress = {"stage": name} if name else {}


def note_step(epoch: int, step: int) -> None:
    """Tell the watchdog where the training loop stands (``step``: the global step, as ``metrics.jsonl`` counts);
    a lost rank's line names it. Cheap: call it every step."""
    if _job is not None:
        _job.progress = {**_job.progress, "epoch": epoch, "step": step}


def _start_watch(timeout_s: float) -> None:
    """After joining: learn who every rank is, write this rank's first heartbeat, and start its watchdog."""
    global _job
    import torch.distributed as dist

    try:
        base = dist.distributed_c10d._get_default_store()
    except Exception:  # (a private function: without it, the process group's timeout alone bounds a lost rank)
        return
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    # Under torchrun the store is a TCPStore in node 0's agent; the watchdog opens connections of its own to it.
    address = (base.host, base.port) if isinstance(base, dist.TCPStore) else None
    me = {
        "node": os.environ.get("GROUP_RANK", "?"),
        "host": socket.gethostname(),
        "rank": rank(),
        "token": uuid.uuid4().hex if rank() == 0 else None,
    }
    roster = gather_objects(me)
    # Keys under a token rank 0 drew: the store outlives the workers when torchrun restarts them (--max-restarts).
    job = _Job(
        [{k: e[k] for k in ("node", "host", "rank")} for e in roster], roster[0]["token"], timeout_s, address, base
    )
    job.beat(job.store())
    dist.barrier()  # (every heartbeat exists before any rank reads one)
    job.thread = threading.Thread(target=_watch, args=(job,), name="falcon-watchdog", daemon=True)
    _job = job
    job.thread.start()


def _stop_watch() -> None:
    global _job
    job, _job = _job, None
    if job is None:
        return
    job.stop.set()
    if job.thread is not None and job.thread is not threading.current_thread():
        job.thread.join(timeout=5 * job.interval)  # (a beat it writes after ours would look like a rank gone silent)
    try:
        job.beat(job.store(), done=True)
    except Exception:  # (the store may be gone with the job)
        pass


def _watch(job: _Job) -> None:
    """The watchdog thread (see the comment above :class:`_Job`)."""
    store, down_since, exit_at = None, None, None
    successor = (job.rank + 1) % len(job.roster)
    seen, changed = None, time.monotonic()
    while not job.stop.wait(job.interval):
        now = time.monotonic()
        try:
            if store is None:
                store = job.client(2 * job.interval)
            job.beat(store)
            down_since = None
            if exit_at is None:
                published = _published(store)
                if published is not None:
                    exit_at, verdict = now + job.exit_grace, published
            if exit_at is None and successor != job.rank:
                value = store.get(f"beat/{successor}")
                if value != seen:
                    seen, changed = value, now
                elif not json.loads(value).get("done") and now - changed > job.stale_after:
                    # Who else is silent (a whole node, say): watched a little longer, beating meanwhile.
                    lost = _silent(job, store, beat=lambda: job.beat(store))
                    if lost is not None:  # (None: a rank published an error meanwhile; it is read next time)
                        line = _lost_line(job, sorted({successor, *lost}), time.monotonic() - changed)
                        verdict = _publish(
                            store, {"line": line, "kind": "FalconError", "code": _EXIT_CODE, "rank": job.rank}
                        )
                        exit_at = time.monotonic() + job.exit_grace
        except Exception:
            store = None  # (reconnect next time)
            down_since = down_since or now
            if exit_at is None and now - down_since > job.stale_after:
                verdict = {"line": _store_lost_line(job), "code": _EXIT_CODE}
                exit_at = now
        if exit_at is not None and now >= exit_at and not job.stop.is_set():
            _exit(job, verdict)


def _exit(job: _Job, verdict: dict) -> None:
    """End this process with ``verdict``'s line, unless the main thread is already reporting an error (then it
    prints, and this only ends a process whose clean-up hangs)."""
    with job.lock:
        if not job.surfacing:
            make_console(stderr=True).print(f"[bold red]error:[/] {escape(verdict['line'])}")
            _end(verdict)
            return  # (only where os._exit is a test's stand-in)
    if not job.stop.wait(4 * job.exit_grace):
        _end(verdict)


def _end(verdict: dict) -> None:
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(int(verdict.get("code") or _EXIT_CODE))


def _published(store) -> dict | None:
    """The error a rank published, or None."""
    return json.loads(store.get(_ERROR)) if store.check([_ERROR]) else None


def _publish(store, verdict: dict) -> dict:
    """Publish ``verdict`` unless a rank was first; the verdict that stands."""
    return json.loads(store.compare_set(_ERROR, "", json.dumps(verdict)))


def _as_error(verdict: dict) -> FalconError:
    kind = Refused if verdict.get("kind") == "Refused" else FalconError
    return kind(verdict["line"], exit_code=int(verdict.get("code") or _EXIT_CODE))


def surface(exc: BaseException) -> BaseException:
    """Where a command's exception surfaces (:func:`stages.run_stages`, the CLI): tell the other ranks, and explain a
    failed collective. Returns what to raise (``exc``, or a :class:`FalconError` in its place).

    * a :class:`FalconError` (a refusal, a failed check, an error in a stage) is published as it is, so every rank
      stops with this line (the first published line wins; :class:`Preempted` is not published: every rank stops
      by itself);
    * a backend error (gloo's closed connection or timeout, NCCL's, the store's) becomes one line: the error another
      rank published, else the rank(s) whose heartbeat stopped (node, host, rank; the stage, epoch and step), else the
      rendezvous host when the store is gone, else a collective that outwaited ``pretrain.runtime.dist_timeout``;
    * any other exception is published as ``node N (host, rank R) failed ...: Type: message`` and raised as it is
      (its traceback stays on this rank).

    Idempotent; a no-op single-process or before joining."""
    job = _job
    if job is None or getattr(exc, "_falcon_surfaced", False):
        return exc
    with job.lock:  # (from here on the main thread prints the line; the watchdog no longer does)
        job.surfacing = True
    result = exc
    try:
        if isinstance(exc, FalconError):
            if not isinstance(exc, Preempted):  # (every rank stops by itself, after the checkpoint: nothing to tell)
                _publish(
                    job.store(),
                    {
                        "line": str(exc),
                        "kind": "Refused" if isinstance(exc, Refused) else "FalconError",
                        "code": exc.exit_code,
                        "rank": job.rank,
                    },
                )
        elif _is_backend_error(exc):
            result = _explain(job)
        elif isinstance(exc, Exception):
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            _publish(
                job.store(),
                {
                    "line": f"{where()} failed {_during(job.progress)}: {type(exc).__name__}: {first} "
                    "(its traceback is in that rank's output)",
                    "kind": "FalconError",
                    "code": _EXIT_CODE,
                    "rank": job.rank,
                },
            )
    except Exception:  # (the store gone: telling the others must never hide this rank's own error)
        if result is exc and _is_backend_error(exc):
            result = FalconError(_store_lost_line(job), exit_code=_EXIT_CODE)
    for e in {id(exc): exc, id(result): result}.values():
        try:
            e._falcon_surfaced = True
        except AttributeError:
            pass
    return result


_BACKEND_WORDS = ("gloo", "nccl", "c10d", "processgroup")
"""What a collective's RuntimeError names (gloo's carry the source path, e.g. ``gloo/transport/tcp/pair.cc``)."""


def _is_backend_error(exc: BaseException) -> bool:
    """A failed collective or store operation (anywhere in ``exc``'s chain of causes)."""
    import torch.distributed as dist

    return any(
        isinstance(err, dist.DistError)
        or (isinstance(err, RuntimeError) and any(word in str(err).lower() for word in _BACKEND_WORDS))
        for err in causes(exc)
    )


def _explain(job: _Job) -> FalconError:
    """The one line for a collective that failed here: what a rank published, else who stopped answering."""
    try:
        store = job.store()
        silent = _silent(job, store)  # (watches the heartbeats for a few intervals; returns early on a published error)
        published = _published(store)
        if published is None:
            line = _lost_line(job, silent, None) if silent else _slow_line(job)
            published = _publish(store, {"line": line, "kind": "FalconError", "code": _EXIT_CODE, "rank": job.rank})
        return _as_error(published)
    except Exception:
        return FalconError(_store_lost_line(job), exit_code=_EXIT_CODE)


def _silent(job: _Job, store, beat: Callable[[], None] | None = None) -> list[int] | None:
    """The ranks (not this one, not finished) whose heartbeat does not move over three intervals; None as soon as a
    rank publishes an error instead. ``beat`` keeps this rank's own heartbeat going meanwhile (the watchdog's call)."""
    keys = [f"beat/{r}" for r in range(len(job.roster))]
    first = store.multi_get(keys)
    deadline = time.monotonic() + 3 * job.interval
    while time.monotonic() < deadline:
        if store.check([_ERROR]):
            return None
        if beat is not None:
            beat()
        time.sleep(min(0.25, job.interval / 2))
    last = store.multi_get(keys)
    return [
        r
        for r in range(len(job.roster))
        if r != job.rank and first[r] == last[r] and not json.loads(last[r]).get("done")
    ]


def _during(progress: dict) -> str:
    """Where the job stood: ``in stage pretrain at epoch 1, step 9``."""
    if not progress.get("stage"):
        return "before the first stage"
    text = f"in stage {progress['stage']}"
    if progress.get("step") is not None:
        text += f" at epoch {progress.get('epoch')}, step {progress['step']}"
    return text


def _ranks_text(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 8-15`` or ``ranks 2, 5``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return "ranks " + ", ".join(runs)


def _describe(job: _Job, ranks: list[int]) -> str:
    """``node 1 (gpu-017, rank 8)``; several ranks grouped by node, nodes joined by ``and``."""
    nodes: dict[tuple[str, str], list[int]] = {}
    for r in sorted(ranks):
        entry = job.roster[r]
        nodes.setdefault((entry["node"], entry["host"]), []).append(r)
    return " and ".join(f"node {node} ({host}, {_ranks_text(rs)})" for (node, host), rs in nodes.items())


_RELAUNCH = (
    "relaunch with --resume to continue from the last checkpoint (torchrun --max-restarts does it by itself; "
    "docs/cluster.md)"
)


def _lost_line(job: _Job, ranks: list[int], silent_s: float | None) -> str:
    how = f"no heartbeat for {silent_s:.0f} s" if silent_s is not None else "its heartbeat stopped"
    return (
        f"lost {_describe(job, ranks)} {_during(job.progress)}: it stopped answering ({how}), so every rank "
        f"stops; {_RELAUNCH}"
    )


def _store_lost_line(job: _Job) -> str:
    head = next((e for e in job.roster if e["node"] == "0"), job.roster[0])
    return (
        f"the rendezvous host, node {head['node']} ({head['host']}), is unreachable {_during(job.progress)}: the "
        f"job's store, which its torchrun agent holds, is gone, so every rank stops; {_RELAUNCH}"
    )


def _slow_line(job: _Job) -> str:
    return (
        f"a collective waited longer than pretrain.runtime.dist_timeout ({job.timeout_s:g} s) {_during(job.progress)}, "
        "yet every rank is alive: one rank's work between two collectives took longer; raise "
        "pretrain.runtime.dist_timeout (docs/cluster.md)"
    )
