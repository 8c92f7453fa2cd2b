"""TrainState: every stateful part saved and restored by name in one place; never training over checkpoints
by accident; damaged checkpoints passed over."""

from __future__ import annotations

import pytest
import torch

from falcon_cli.errors import Refused
from falcon_cli.runtime.train_state import Generators, GlobalRng, TrainState


class Counter:
    """A stateful part: a value and how many times it was restored."""

    def __init__(self, value=0):
        self.value, self.restored = value, 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value, self.restored = state["value"], self.restored + 1


def make(tmp_path, seed=0, lines=None):
    model = torch.nn.Linear(3, 2)
    torch.nn.init.constant_(model.weight, float(seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    parts = {"shared": Counter(), "mine": Counter(), "generators": Generators(a=torch.Generator().manual_seed(seed))}
    state = TrainState(tmp_path / "checkpoints", {"model": model}, what="test",
                       shared={"optimizer": optimizer, "counter": parts["shared"], "absent": None},
                       per_rank={"rng": GlobalRng(), "generators": parts["generators"], "counter": parts["mine"]},
                       keep_last=2, meta={"note": "x"}, say=(lines.append if lines is not None else print))
    return state, model, optimizer, parts


def test_what_was_saved_is_what_a_resume_restores(tmp_path):
    state, model, optimizer, parts = make(tmp_path)
    assert state.begin(resume=False, overwrite=False) is None
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    parts["shared"].value, parts["mine"].value = 7, 11
    parts["generators"]["a"].manual_seed(42)
    torch.manual_seed(5)
    state.step, state.values = 30, {"results": {"R@1": 1.5}}
    checkpoint = state.save(2, 4)
    after_save = (torch.rand(3), torch.rand(3, generator=parts["generators"]["a"]))

    lines = []
    fresh, model2, optimizer2, parts2 = make(tmp_path, seed=9, lines=lines)
    assert fresh.begin(resume=True, overwrite=False) == checkpoint
    assert (fresh.epoch, fresh.batch_index, fresh.step, fresh.values) == (2, 4, 30, {"results": {"R@1": 1.5}})
    assert torch.equal(model2.weight, model.weight) and parts2["shared"].value == 7 and parts2["mine"].value == 11
    assert optimizer2.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert torch.equal(torch.rand(3), after_save[0]), "the global RNG continues where the save left it"
    assert torch.equal(torch.rand(3, generator=parts2["generators"]["a"]), after_save[1])
    assert any(line.startswith(f"resumed from {checkpoint} (epoch 2, step 30)") for line in lines)
    assert '"note": "x"' in (checkpoint / "meta.json").read_text()


def test_checkpoints_are_never_trained_over_without_resume_or_overwrite(tmp_path):
    state, *_ = make(tmp_path)
    state.begin(resume=False, overwrite=False)
    state.step = 8
    state.save(1, 0)
    again, *_ = make(tmp_path)
    with pytest.raises(Refused, match="already holds test checkpoints .the newest after step 8.: pass --resume"):
        again.begin(resume=False, overwrite=False)
    assert (tmp_path / "checkpoints" / "00000008").is_dir(), "a refusal changes nothing"
    assert again.begin(resume=False, overwrite=True) is None and not (tmp_path / "checkpoints").exists()


def test_a_damaged_newest_checkpoint_is_passed_over(tmp_path):
    state, _, _, parts = make(tmp_path)
    state.begin(resume=False, overwrite=False)
    for step, value in ((4, 1), (8, 2)):
        state.step, parts["shared"].value = step, value
        state.save(0, step)
    (tmp_path / "checkpoints" / "00000008" / "training_state.pt").write_bytes(b"garbage")
    lines = []
    resumed, _, _, parts2 = make(tmp_path, lines=lines)
    assert resumed.begin(resume=True, overwrite=False).name == "00000004" and parts2["shared"].value == 1
    assert any("damaged checkpoints passed over" in line and "00000008" in line for line in lines)


def test_a_resume_with_nothing_to_resume_starts_fresh(tmp_path):
    lines = []
    state, *_ = make(tmp_path, lines=lines)
    assert state.begin(resume=True, overwrite=False) is None and state.step == 0
    assert any("nothing to resume" in line for line in lines)
