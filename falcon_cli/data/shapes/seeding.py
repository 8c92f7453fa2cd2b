"""Per-item random generators derived from (seed, stream, index...).

Every random choice of a world comes from a generator that depends only on the world seed,
a stream number (what the randomness is for) and the item's index, never on how many draws
came before. That is what makes generation byte-identical across runs and independent of
how the work is split between processes, and why changing e.g. the caption mix leaves the
images unchanged.

Text and scene choices use :class:`random.Random` (scalar draws are ~10x cheaper than
numpy's); pixel noise uses a numpy Generator because it draws whole arrays.
"""

from __future__ import annotations

import random

import numpy as np

STREAM_SCENES = 1
STREAM_PIXELS = 2
STREAM_CAPTIONS = 3
STREAM_QUESTIONS = 4
STREAM_SPLITS = 5
STREAM_STATEMENTS = 6
STREAM_NEAR_MISSES = 7
STREAM_EXTRA_SCENES = 8
STREAM_EXTRA_PIXELS = 9


def stream_random(seed: int, stream: int, *index: int) -> random.Random:
    """A :class:`random.Random` for one item (string seeds are hashed with SHA-512: stable across runs)."""
    return random.Random("shapes/" + "/".join(str(v) for v in (seed, stream, *index)))


def stream_generator(seed: int, stream: int, *index: int) -> np.random.Generator:
    """A numpy Generator for one item (seeded through SeedSequence)."""
    return np.random.default_rng([seed, stream, *index])
