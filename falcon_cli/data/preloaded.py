"""Training images decoded once into one device tensor (``pretrain.loader.preload_images``).

With a fixed transform (``augment: test``) an image's pixels are the same every epoch, so
decoding a PNG or JPEG for every step is wasted work: on a GPU it is what sets the pace of a
tiny model. :class:`PreloadedImages` decodes and transforms each distinct image of the
pretraining set once (in DataLoader workers, with the very transform of the per-step path, so
the pixels are bitwise the same), keeps them as one ``[images, 3, R, R]`` tensor on the
training device, and gathers a batch by pair id there.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from falcon_cli.data.images import load_image
from falcon_cli.runtime.progress import track


class _DistinctImages(Dataset):
    """Each distinct image path once, transformed."""

    def __init__(self, paths: Sequence, transform: Callable):
        self.paths, self.transform = list(paths), transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(load_image(self.paths[index]))


class PreloadedImages:
    """``images(pair_ids)`` -> the transformed images of those pairs ``[B, 3, R, R]``, on ``device``.

    Args:
        records: the pretraining records (``pair_id``, ``image``); pairs that share an image file share a row.
        transform: the fixed image transform (PIL image -> float tensor), exactly the per-step path's.
        device: where the tensor lives (the training device).
        num_workers: decoding processes (as the training loader's).
    """

    def __init__(
        self,
        records: Sequence,
        transform: Callable,
        device: torch.device,
        *,
        num_workers: int = 0,
        batch_size: int = 256,
    ):
        paths: dict = {}
        rows = [paths.setdefault(r.image, len(paths)) for r in records]
        # Its own generator: a loader that drew from the global RNG would shift the run's dropout.
        loader = DataLoader(
            _DistinctImages(list(paths), transform),
            batch_size=batch_size,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(0),
        )
        chunks = [chunk.to(device) for chunk in track(loader, "preloading images", total=len(loader))]
        self.pixels = torch.cat(chunks) if chunks else torch.empty(0, 3, 1, 1, device=device)
        pair_ids = torch.tensor([r.pair_id for r in records], dtype=torch.long)
        size = int(pair_ids.max()) + 1 if len(pair_ids) else 0
        self.row = torch.full((size,), -1, dtype=torch.long)
        self.row[pair_ids] = torch.tensor(rows, dtype=torch.long)
        self.row = self.row.to(device)

    @property
    def nbytes(self) -> int:
        """Device memory the pixels take."""
        return self.pixels.numel() * self.pixels.element_size()

    def images(self, pair_ids: torch.Tensor) -> torch.Tensor:
        """The images of ``pair_ids`` (a tensor on the training device), gathered without leaving it."""
        return self.pixels.index_select(0, self.row[pair_ids])
