"""The shapes oracle as a judge: exact ground truth, 0.0 or 1.0 per pair."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from falcon_cli.data.shapes import ShapesOracle
from falcon_cli.errors import FalconError
from falcon_cli.judges.base import JudgedPair


class OracleJudge:
    """Scores pairs of a shapes world from its scene graphs: 1.0 when the caption truly describes
    the image, else 0.0 (:meth:`ShapesOracle.matches`). Needs ``image_id`` and ``caption_id`` on every pair."""

    def __init__(self, world_dir: str | Path):
        self.world_dir = Path(world_dir)
        self.oracle = ShapesOracle.load(self.world_dir)
        self.name = f"oracle:{self.world_dir}"

    def score(self, pairs: Sequence[JudgedPair]) -> np.ndarray:
        """``float64[len(pairs)]``: 1.0 for a true match, 0.0 otherwise."""
        if not pairs:
            return np.zeros(0, dtype=np.float64)
        for index, pair in enumerate(pairs):
            if pair.image_id is None or pair.caption_id is None:
                missing = "image_id" if pair.image_id is None else "caption_id"
                raise FalconError(
                    f"oracle judge: pair {index} ({pair.image}, {pair.caption!r}) has no {missing}; "
                    "the oracle needs the shapes world's image and caption ids (use a model judge otherwise)"
                )
        image_ids = np.array([pair.image_id for pair in pairs], dtype=np.int64)
        caption_ids = np.array([pair.caption_id for pair in pairs], dtype=np.int64)
        return self.oracle.matches(image_ids, caption_ids).astype(np.float64)


def in_batch_truth(world_dir: str | Path, records) -> Callable[[torch.Tensor], torch.Tensor]:
    """``truth(pair_ids) -> bool [B, B]`` (CPU) for a batch of a shapes world's pretraining pairs: entry
    ``[i, j]`` says whether pair j's caption truly describes pair i's image, off the diagonal (the
    in-batch false negatives). ``records``: the pretraining records, with ``image_id`` / ``caption_id``."""
    oracle = ShapesOracle.load(world_dir)
    ids = {r.pair_id: (r.extra.get("image_id"), r.extra.get("caption_id")) for r in records}

    def truth(pair_ids: torch.Tensor) -> torch.Tensor:
        image_ids, caption_ids = zip(*(ids[int(i)] for i in pair_ids.tolist()))
        matrix = torch.from_numpy(oracle.matrix(list(image_ids), list(caption_ids)))
        return matrix & ~torch.eye(len(pair_ids), dtype=torch.bool)

    return truth


__all__ = ["OracleJudge", "in_batch_truth"]
