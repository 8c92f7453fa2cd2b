"""``pretrain.runtime.profile_steps``: a torch.profiler trace of a few training steps, and its summary.

The profiler starts at the first step of the second epoch (epoch 0 is uniform batches for every
composer; later epochs are where GRIT, the quantile composers and FALCON do their work) — or at
step 10 of a one-epoch run — records ``steps`` steps, and writes under ``RUN/profile/``:

* ``trace.json``: the Chrome/Perfetto trace (open it at https://ui.perfetto.dev);
* ``summary.txt``: the profiled steps' wall time beside the time the device spent in kernels (on a
  GPU: how much of a step the host, not the device, sets), then operators by total self time on the
  device (CPU time where there is no GPU), the view that says where each millisecond of a step goes.

FALCON's reward passes and scheduler update run in their own ``record_function`` ranges
(``falcon/reward``, ``falcon/update``); composing its next batch shows under the DataLoader's
``__next__``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


class StepProfiler:
    """Profile ``steps`` training steps starting at ``start`` (a global step), then write the results."""

    def __init__(self, out: Path, steps: int, start: int, device: torch.device, enabled: bool = True):
        self.out, self.steps, self.start, self.device = Path(out), steps, start, device
        self.enabled = enabled and steps > 0
        self.profiler: profile | None = None
        self.done = False

    def before(self, step: int) -> None:
        """Call at the start of every step (``step`` = the global step about to run)."""
        if not self.enabled or self.done or self.profiler is not None or step < self.start:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self.profiler = profile(activities=activities, record_shapes=False)
        self.profiler.__enter__()
        self.first, self.started = step, time.perf_counter()

    def after(self, step: int) -> None:
        """Call at the end of every step (``step`` = the global step just finished)."""
        if self.profiler is None or step - self.first < self.steps:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - self.started
        self.profiler.__exit__(None, None, None)
        self.out.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(self.out / "trace.json"))
        key = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        averages = self.profiler.key_averages()
        table = averages.table(sort_by=key, row_limit=40)
        # The named ranges (FALCON's falcon/reward and falcon/update) spend their time in their children, so a
        # table sorted by self time may leave them out: they get their own lines, by total time.
        ranges = "\n".join(
            f"{e.key:<24} {e.count:>5} calls  cpu total {e.cpu_time_total / 1e3:10.2f} ms"
            + (
                f"  device total {getattr(e, 'device_time_total', 0) / 1e3:10.2f} ms"
                if self.device.type == "cuda"
                else ""
            )
            for e in averages
            if e.key.startswith("falcon/")
        )
        # Kernel time against wall time: a device busy for most of the wall clock is compute- or memory-bound;
        # one idle for most of it waits on the host (launches, Python, synchronisations, data).
        busy = (
            sum(
                e.self_device_time_total
                for e in averages
                if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
            )
            / 1e3
            if self.device.type == "cuda"
            else None
        )  # (kernels and copies: an operator's self time or a named range repeats them)
        head = (
            f"{self.steps} steps from step {self.first}: {wall * 1e3 / self.steps:.2f} ms per step wall clock "
            "(profiler on)"
            + (
                f", device busy {busy / self.steps:.2f} ms per step ({busy / (wall * 1e3):.0%})"
                if busy is not None
                else ""
            )
        )
        (self.out / "summary.txt").write_text(
            f"{head}\n\nsorted by {key}\n{table}\n"
            + (f"\nNamed ranges (total time, children included)\n{ranges}\n" if ranges else "")
        )
        self.profiler, self.done = None, True
