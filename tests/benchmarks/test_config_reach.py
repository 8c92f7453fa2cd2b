"""benchmarks/config_reach.py: which modules read the whole pretrain section, by the rule its docstring states."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("config_reach", REPO / "benchmarks" / "config_reach.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rule_counts_reads_through_the_section_and_not_through_narrower_objects(tmp_path):
    reach = _script()
    source = tmp_path / "m.py"
    source.write_text(
        "def a(config):\n    return config.pretrain.epochs + config.pretrain.batch_size\n"
        "def b(p, q):\n    return p.optim.lr, q.optim, p.not_a_field\n"
        "def c(config):\n    s = config.pretrain\n    return s.composer\n"
        "class D:\n    def __init__(self, p):\n        self.p = p\n    def f(self):\n        return self.p.scheduler\n"
        "def e(scheduler):\n    return scheduler.lr, scheduler.reward\n"
    )
    found = reach.reads(source)
    assert found == {"epochs": 1, "batch_size": 1, "optim": 1, "composer": 1, "scheduler": 1}
    assert reach.reads(REPO / "stages" / "pretrain.py")["composer"] > 0
