"""How often a composer puts near misses together: the share of batch rows whose pair has a sibling scene in its batch.

In a shapes world drawn with near-miss families (``data.shapes.near_misses``), a sibling in the batch is the hardest
negative the world can give an anchor. Uniform batches hold one by chance (about ``batch × (family − 1) / pairs``);
a hard-negative composer should hold many more. This reads it straight from the batch log.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def near_miss_share(log: pd.DataFrame, family_of_pair: np.ndarray) -> pd.DataFrame:
    """Per epoch: ``share``, the fraction of the log's rows whose pair shares its near-miss family with another row
    of the same (epoch, step) batch (another pair of the same image counts too), and ``rows``. ``family_of_pair[p]``
    is pair ``p``'s family (its image id // family size)."""
    if log.empty:
        return pd.DataFrame({"epoch": [], "share": [], "rows": []})
    frame = pd.DataFrame(
        {
            "epoch": log["epoch"].to_numpy(),
            "step": log["step"].to_numpy(),
            "family": np.asarray(family_of_pair)[log["pair_id"].to_numpy()],
        }
    )
    together = frame.groupby(["epoch", "step", "family"])["family"].transform("size") > 1
    out = together.groupby(frame["epoch"]).agg(share="mean", rows="size").reset_index()
    return out.astype({"epoch": int, "share": float, "rows": int})


__all__ = ["near_miss_share"]
