"""The embedding cache sharded by rank (falcon_cli/sampling/sharded_cache.py) against the full cache every rank used
to hold, under torch.distributed (gloo processes on CPU); per-rank checkpoint files (rank-<r>.pt): a round trip,
a rank that cannot write, a damaged rank file that sends every rank back to the same earlier checkpoint."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from falcon_cli.runtime import distributed as D
from falcon_cli.sampling.cache import EmbeddingCache
from falcon_cli.sampling.composers import shard_pair_ids
from falcon_cli.sampling.sharded_cache import ShardedCache, cache_bytes_per_rank, first_holder

DIM = 8


def _join(rank: int, world: int, store: str) -> None:
    # a file store: no TCP port to collide with other tests' process groups; RANK / WORLD_SIZE as torchrun sets them
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _leave() -> None:
    dist.barrier()  # every rank done with the group before any tears it down
    dist.destroy_process_group()


def features(ids: torch.Tensor, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit features of ``ids`` for one step (the same on every rank for the same arguments)."""
    g = torch.Generator().manual_seed(1000 * epoch + step)
    image, text = torch.randn(2, len(ids), DIM, generator=g)
    return torch.nn.functional.normalize(image, dim=1), torch.nn.functional.normalize(text, dim=1)


def assert_rows_match(cache: EmbeddingCache, reference: EmbeddingCache, what: str) -> None:
    """``cache`` holds exactly what ``reference`` (the full cache) holds for its pairs: features and ``written``."""
    rows = reference.rows(cache.pair_ids)
    assert torch.equal(cache.written, reference.written[rows]), what
    assert torch.equal(cache.image, reference.image[rows]) and torch.equal(cache.text, reference.text[rows]), what


def _simulated_training(rank: int, world: int, store: str, out: str) -> None:
    """Epochs as pretraining runs them: shards dealt from one generator, each rank training the first ``steps`` batches
    of its shard (so some pairs are not trained: their old features must carry over), the features all-gathered and
    stored in a full reference cache and in the sharded cache; a checkpoint round trip in the middle of an epoch and a
    checkpoint from before sharding (the whole cache) restored; the epoch's embeddings.h5 written from every rank."""
    _join(rank, world, store)
    try:
        from falcon_cli.artifacts.embeddings import read_embeddings
        from falcon_cli.sampling import sharded_cache

        # chunks of a few rows: the hand-over, the gathers to rank 0 and the copies run in many rounds, ranks with
        # fewer rows padding theirs (this forked process's module only)
        sharded_cache.HAND_OVER_ROWS, sharded_cache.SAVE_CHUNK_ROWS = 2 * world, 3 * world

        ids = torch.arange(5, 5 + 3 * 23, 3)  # 23 ids, not contiguous; with 2 or 3 ranks padding repeats some
        n, batch = len(ids), 3
        shard_generator = torch.Generator().manual_seed(7)
        reference = EmbeddingCache(ids, DIM, dtype=torch.float32)
        cache = ShardedCache(ids, DIM, dtype=torch.float32, rank=rank, world=world)
        per = math.ceil(n / world)
        for epoch in range(4):
            shard = shard_pair_ids(ids, rank, world, shard_generator)
            peek = torch.Generator()
            peek.set_state(shard_generator.get_state())
            reading = cache.begin(shard, shard_pair_ids(ids, rank, world, peek))
            if epoch:  # what the composer reads: the full cache's rows of the shard, exactly
                assert_rows_match(reading, reference, f"epoch {epoch}: reading cache at begin")
            cache.reset()
            reference.reset()
            expected = cache_bytes_per_rank(n, world, dim=DIM, dtype=torch.float32)
            if epoch:
                assert cache.rows == 2 * per and len(reading) == len(cache.filling) == per
                assert cache.nbytes == expected["device_bytes"]
            else:  # nothing filled yet, nothing reads it: no reading cache (epoch 0 is uniform or a warm start's)
                assert reading is None and cache.rows == len(cache.filling) == per
                assert cache.nbytes == expected["between_epochs_bytes"]
            steps = 2 if epoch % 2 else per // batch  # odd epochs leave most pairs untrained
            for step in range(steps):
                mine = shard[step * batch : (step + 1) * batch]
                gathered = D.all_gather_cat(mine)
                image, text = features(gathered, epoch, step)
                reference.update(gathered, image, text)
                cache.update(gathered, image, text)
                if epoch:
                    assert_rows_match(cache.reading, reference, f"epoch {epoch} step {step}: reading cache")
                if epoch == 1 and step == 0:  # a checkpoint in the middle of the epoch: saved and restored
                    restored = ShardedCache(ids, DIM, dtype=torch.float32, rank=rank, world=world)
                    restored.load_state_dict(cache.state_dict())
                    assert torch.equal(restored.owned, cache.owned)
                    for mine_, theirs in ((restored.reading, cache.reading), (restored.filling, cache.filling)):
                        for key in ("pair_ids", "image", "text", "filled", "written"):
                            assert torch.equal(getattr(mine_, key), getattr(theirs, key)), key
                    assert_rows_match(restored.reading, reference, "restored")
                    cache = restored
                if epoch == 2 and step == 0:  # a checkpoint from before sharding: every rank holds the whole cache
                    cache = ShardedCache(ids, DIM, dtype=torch.float32, rank=rank, world=world)
                    cache.load_state_dict(reference.state_dict())
                    assert cache.rows == n
            cache.end()
            held = cache.filling
            assert cache.reading is None and cache.rows == len(held), "between epochs: one cache"
            assert_rows_match(held, reference, f"epoch {epoch}: next epoch's rows after the hand-over")
            path = cache.save(
                f"{out}/epoch_{epoch}.h5",
                {"model": "m", "checkpoint": "c", "dataset": "d", "split": "pretrain", "epoch": epoch},
            )
            assert (path is not None) == (rank == 0)
            if rank == 0:
                emb = read_embeddings(path)
                written = reference.pair_ids[reference.written]
                assert sorted(emb.pair_id.tolist()) == sorted(written.tolist()), "every written pair once"
                rows = reference.rows(torch.from_numpy(emb.pair_id))
                expected = torch.nn.functional.normalize(reference.image[rows], dim=1)
                assert np.allclose(emb.image.astype(np.float32), expected.numpy(), atol=2e-3)
            dist.barrier()
        _leave()
    except BaseException:
        dist.destroy_process_group()
        raise


def start(fn, args: tuple, world: int) -> None:
    """``fn(rank, *args)`` in ``world`` processes forked from this one (no re-import of torch: seconds saved)."""
    mp.start_processes(fn, args=args, nprocs=world, join=True, start_method="fork")


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_caches_hold_what_the_full_cache_holds_for_their_shards(tmp_path, world):
    # 23 pairs in 24 slots (2 or 3 ranks): padding deals one pair to two ranks
    start(_simulated_training, (world, str(tmp_path / "store"), str(tmp_path)), world)


def test_one_process_keeps_one_cache_of_every_pair():
    """world 1: one EmbeddingCache of every pair, in the dataset's order, both reading and filling (as before)."""
    ids = torch.tensor([9, 3, 7, 1])
    cache = ShardedCache(ids, DIM)
    assert cache.reading is cache.filling and torch.equal(cache.filling.pair_ids, ids)
    assert cache.begin(ids.flip(0), None) is cache.filling and cache.rows == 4
    cache.update(ids[:2], *features(ids[:2], 0, 0))
    cache.end()
    assert cache.reading is cache.filling and bool(cache.filling.written[:2].all())
    state = cache.state_dict()
    again = ShardedCache(ids, DIM)
    before = again.filling
    again.load_state_dict(state)
    assert again.filling is before, "restored in place: no second cache of every pair"
    assert torch.equal(again.filling.image, cache.filling.image)
    old = ShardedCache(ids, DIM)
    old.load_state_dict(cache.filling.state_dict())  # a checkpoint from before sharding
    assert torch.equal(old.filling.image, cache.filling.image)


@pytest.mark.parametrize("n, world", [(23, 3), (24, 3), (2, 4), (160, 8), (7, 1)])
def test_every_pair_has_exactly_one_first_holder(n, world):
    """Padding deals a few pairs to two ranks: embeddings.h5 gets each from the first only."""
    ids = torch.arange(n) * 2
    g = torch.Generator().manual_seed(n)
    owned = []
    for rank in range(world):
        gen = torch.Generator()
        gen.set_state(g.get_state())
        shard = shard_pair_ids(ids, rank, world, gen)
        owned += shard[first_holder(len(shard), n, rank)].tolist()
    assert sorted(owned) == ids.tolist()


def test_cache_bytes_per_rank_at_fourteen_million_pairs():
    """The issue's target: at 14M pairs and world 8, under ~4 GB of device memory and ~16 GB of host memory per rank."""
    sharded, full = cache_bytes_per_rank(14_000_000, 8), cache_bytes_per_rank(14_000_000, 1)
    assert sharded["rows"] == 1_750_000 and full["rows"] == 14_000_000
    assert sharded["device_bytes"] + sharded["transient_bytes"] < 4e9
    assert sharded["checkpoint_host_bytes"] < 4e9
    assert full["device_bytes"] == full["full_cache_bytes"] == sharded["full_cache_bytes"] > 14e9
    assert sharded["between_epochs_bytes"] < sharded["device_bytes"] / 1.9


# --- per-rank checkpoint files ----------------------------------------------------------------------------------


class Part:
    """A stateful part holding a value and a tensor."""

    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": self.value, "tensor": torch.full((3,), float(self.value))}

    def load_state_dict(self, state):
        assert torch.equal(state["tensor"], torch.full((3,), float(state["value"])))
        self.value = state["value"]


def _state(directory, lines=None):
    from falcon_cli.runtime.train_state import TrainState

    model = torch.nn.Linear(2, 2)
    shared, mine = Part(), Part()
    state = TrainState(
        directory,
        {"model": model},
        what="test",
        shared={"shared": shared},
        per_rank={"mine": mine},
        keep_last=3,
        say=(lines.append if lines is not None else lambda line: None),
    )
    return state, model, shared, mine


def _checkpoints(rank: int, world: int, store: str, directory: str) -> None:
    _join(rank, world, store)
    try:
        from pathlib import Path

        from falcon_cli.errors import FalconError
        from falcon_cli.runtime import checkpoint as C
        from falcon_cli.runtime import train_state as T

        root = Path(directory)
        state, model, shared, mine = _state(root)
        state.begin(resume=False, overwrite=False)
        for step in (4, 8):
            state.step, shared.value, mine.value = step, step, 100 * step + rank
            path = state.save(1, step)
            assert (path == root / f"{step:08d}") if rank == 0 else path is None
        dist.barrier()
        assert sorted(p.name for p in (root / "00000008").iterdir()) == [
            "meta.json",
            "model.safetensors",
            "rank-0.pt",
            "rank-1.pt",
            "training_state.pt",
        ]
        assert "ranks" not in C.load_training_state(root / "00000008"), "nothing gathered on rank 0"

        # a rank that cannot write its part: every rank raises, no checkpoint 12, latest still on 8
        original = T.save_rank_state

        def failing(directory, r, *args, **kwargs):
            if r == 1:
                raise OSError(28, "No space left on device")
            return original(directory, r, *args, **kwargs)

        T.save_rank_state = failing
        state.step = 12
        with pytest.raises(FalconError, match=r"checkpoint 12: rank 1 could not write its part .*No space left"):
            state.save(1, 12)
        T.save_rank_state = original
        dist.barrier()
        assert (root / "latest").read_text().strip() == "00000008" and not (root / "00000012").exists()
        assert not [p for p in root.iterdir() if p.name.startswith(".")], "the staging directory went"

        # a round trip: each rank gets its own part back
        lines = []
        again, _, shared2, mine2 = _state(root, lines)
        assert again.begin(resume=True, overwrite=False) == root / "00000008"
        assert (again.step, shared2.value, mine2.value) == (8, 8, 800 + rank)

        # rank 1's file of the newest checkpoint damaged: every rank resumes from step 4
        dist.barrier()
        if rank == 0:
            damaged = root / "00000008" / "rank-1.pt"
            damaged.write_bytes(damaged.read_bytes()[:100])
        dist.barrier()
        lines = []
        third, _, shared3, mine3 = _state(root, lines)
        assert third.begin(resume=True, overwrite=False) == root / "00000004"
        assert (third.step, shared3.value, mine3.value) == (4, 4, 400 + rank)
        if rank == 0:
            assert any(
                "damaged checkpoints passed over" in line
                and "00000008" in line
                and "rank-1.pt" in line
                and "on rank 1" in line
                for line in lines
            ), lines
        _leave()
    except BaseException:
        dist.destroy_process_group()
        raise


def test_each_rank_writes_and_restores_its_own_checkpoint_file(tmp_path):
    start(_checkpoints, (2, str(tmp_path / "store"), str(tmp_path / "checkpoints")), 2)
