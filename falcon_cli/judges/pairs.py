"""A pretraining dataset's pairs as judges see them: image file, caption text, ids."""

from __future__ import annotations

from functools import lru_cache

from falcon_cli.judges.base import JudgedPair


class DatasetPairs:
    """``pairs(epoch, pair_id)`` -> the :class:`JudgedPair` of that pretraining pair as the run saw it in
    ``epoch`` (entries with several captions yield one per epoch, seeded like training). ``KeyError`` for
    a pair the dataset lacks. Used by the false-negative audit and by MAFA's discriminator."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.records = {r.pair_id: r for r in dataset.records}
        self._pair = lru_cache(maxsize=1 << 20)(self._build)

    def __call__(self, epoch: int, pair_id: int) -> JudgedPair:
        return self._pair(int(epoch), int(pair_id))

    def __contains__(self, pair_id: int) -> bool:
        return int(pair_id) in self.records

    def _build(self, epoch: int, pair_id: int) -> JudgedPair:
        record = self.records[pair_id]
        if len(record.captions) == 1:
            caption = self.dataset.caption_for(record)
        else:  # the caption choice depends on the epoch: ask the dataset at that epoch, then restore it
            current = self.dataset.epoch
            self.dataset.set_epoch(epoch)
            caption = self.dataset.caption_for(record)
            self.dataset.set_epoch(current)
        return JudgedPair(
            image=record.image,
            caption=caption,
            image_id=record.extra.get("image_id"),
            caption_id=record.extra.get("caption_id"),
        )


__all__ = ["DatasetPairs"]
