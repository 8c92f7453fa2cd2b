"""The papers' per-method loss weights that the config schema, the framework records and the objectives read: plain
data, below every package (importing it loads nothing), so that validating a config does not load the objectives."""

ITC_CONSISTENCY_WEIGHT: dict[str, float] = {"none": 0.2, "mafa": 0.0, "srcl": 0.0, "diht": 0.0, "glofnd": 0.0}
"""Each method's own weight of GRIT-VLP's ITC consistency term, the value ``pretrain.losses.itc_consistency_weight``
takes when it is left unset: GRIT-VLP trains the term at 0.2 (hard-coded in its code), and so do the
composers built on it (FALCON, quantiles, uniform); MAFA's code removes it; SRCL, DiHT and GloFND
have no such term (docs/methods.md, "Which losses each method trains")."""

BLIP2_ITC_LABEL_SMOOTHING = 0.1
"""LAVIS's BLIP-2 ITC smooths its one-hot targets by 0.1 (``label_smoothing=0.1`` in both directions): the
``blip2`` framework record's ``itc_label_smoothing`` and the BLIP-2 objective's default plain ITC."""
