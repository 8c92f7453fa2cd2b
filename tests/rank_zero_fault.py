"""``python -m tests.rank_zero_fault STEP ARGS...``: the ``falcon ARGS`` command in which rank 0 alone raises a
:class:`FalconError` when its training loop logs step STEP, while the other ranks go on to the step's collectives (as
an error in what rank 0 alone does: its metrics, its evaluation, its artifacts).
tests/runtime/test_cluster_faults.py."""

from __future__ import annotations

import sys

from falcon_cli.cli.app import main
from falcon_cli.errors import FalconError
from falcon_cli.runtime import distributed as D
from falcon_cli.runtime import metrics

FAILING_STEP = int(sys.argv[1])
_write = metrics.MetricsLog.write


def write(self, **record) -> None:
    if D.rank() == 0 and record.get("step") == FAILING_STEP and "loss" in record:
        raise FalconError(f"rank 0 alone failed at step {FAILING_STEP} (an error a test injects)")
    _write(self, **record)


metrics.MetricsLog.write = write
main(sys.argv[2:])
