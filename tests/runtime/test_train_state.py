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
    state = TrainState(
        tmp_path / "checkpoints",
        {"model": model},
        what="test",
        shared={"optimizer": optimizer, "counter": parts["shared"], "absent": None},
        per_rank={"rng": GlobalRng(), "generators": parts["generators"], "counter": parts["mine"]},
        keep_last=2,
        meta={"note": "x"},
        say=(lines.append if lines is not None else print),
    )
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


def test_each_rank_has_its_own_file_and_a_damaged_one_is_passed_over(tmp_path):
    """The per-rank parts live in rank-<r>.pt beside training_state.pt (never gathered into it); a damaged rank file
    makes the checkpoint damaged, and the resume continues from the one before it."""
    from falcon_cli.runtime.checkpoint import load_rank_state, load_training_state

    state, _, _, parts = make(tmp_path)
    state.begin(resume=False, overwrite=False)
    for step in (4, 8):
        state.step, parts["mine"].value = step, step
        state.save(0, step)
    newest = tmp_path / "checkpoints" / "00000008"
    assert "ranks" not in load_training_state(newest) and load_rank_state(newest, 0)["counter"] == {"value": 8}
    (newest / "rank-0.pt").write_bytes((newest / "rank-0.pt").read_bytes()[:50])
    lines = []
    resumed, _, _, parts2 = make(tmp_path, lines=lines)
    assert resumed.begin(resume=True, overwrite=False).name == "00000004" and parts2["mine"].value == 4
    assert any("damaged checkpoints passed over" in line and "rank-0.pt" in line for line in lines)
    (newest / "rank-0.pt").unlink()
    (tmp_path / "checkpoints" / "00000004" / "rank-0.pt").rename(newest / "rank-0.pt")  # another step's file
    with pytest.raises(
        Refused,
        match=r"rank-0.pt: holds rank 0 of 1 at step 4, expected rank 0 of 1 at step 8.*"
        r"00000004.*rank-0.pt: missing",
    ):
        make(tmp_path)[0].begin(resume=True, overwrite=False)


def test_a_checkpoint_from_before_rank_files_is_still_read(tmp_path):
    """Older checkpoints hold every rank's parts in training_state.pt's ``ranks``, and held the embedding cache as a
    shared part: a part that is per rank now restores from its shared copy."""
    from falcon_cli.runtime.checkpoint import save_checkpoint

    model = torch.nn.Linear(3, 2)
    old = {
        "world_size": 1,
        "epoch": 1,
        "batch_index": 2,
        "global_step": 6,
        "values": {"best": 3},
        "counter": {"value": 5},
        "moved": {"value": 9},
        "ranks": [{"counter": {"value": 7}}],
    }
    save_checkpoint(tmp_path / "checkpoints", 6, {"model": model}, old, {"epoch": 1})
    shared, mine, moved = Counter(), Counter(), Counter()
    state = TrainState(
        tmp_path / "checkpoints",
        {"model": torch.nn.Linear(3, 2)},
        what="test",
        shared={"counter": shared},
        per_rank={"counter": mine, "moved": moved},
        keep_last=2,
        say=lambda line: None,
    )
    assert state.begin(resume=True, overwrite=False).name == "00000006"
    assert (state.epoch, state.batch_index, state.step, state.values) == (1, 2, 6, {"best": 3})
    assert (shared.value, mine.value, moved.value) == (5, 7, 9)
