"""falcon's own false-negative methods, one file each, its batch composers (``composers.py``) and FALCON's rewards
(``rewards.py``: the loss decreases; ``positive_margin.py``: the pick scores), registered by name as a contributor's
would be (:mod:`falcon_cli.registry`, docs/extending.md). Each method's file holds its settings,
``pretrain.false_negatives.<name>``, and the function that builds it; its loss lives in :mod:`falcon_cli.objectives`.
Importing this package is light (pydantic only): the schema reads the settings when a recipe is validated; torch is
imported when a method is built."""

from falcon_cli.methods import composers, diht, glofnd, itm_progress, mafa, positive_margin, rewards, srcl  # noqa: F401 (each registers itself)
