"""FALCON's loss-decrease rewards (Algorithm 2's Δ): the fall of a loss on the batch over the model's update.

``mlm`` is the paper's (ALBEF); ``itg`` is BLIP-2's (it has no MLM: the paper's Table 3 uses its image-grounded text
generation loss); ``caption`` is a dual encoder's decoder loss (SigLIP 2's reward in the later FALCON paper), ``itc``
its contrastive loss; the sums are the paper's ablations. ``alignment`` (ours) is minus each pair's own image-text
cosine, so its decrease is the rise of that cosine: a false negative next to a pair pulls the pair apart."""

from falcon_cli.registry import loss_decrease_reward

loss_decrease_reward("mlm", ("mlm",), frameworks=("albef",), description="the MLM loss's decrease (the paper)")
loss_decrease_reward("itg", ("itg",), frameworks=("blip2",), description="BLIP-2's image-grounded generation loss")
loss_decrease_reward("caption", ("caption",), frameworks=("dual",), description="a dual encoder's captioning loss")
loss_decrease_reward(
    "itc", ("itc",), per_pair=False, frameworks=("dual",), description="a dual encoder's contrastive loss"
)
loss_decrease_reward("itc+itm", ("itc", "itm"), per_pair=False, frameworks=("albef", "blip2"))
loss_decrease_reward("itc+itm+mlm", ("itc", "itm", "mlm"), per_pair=False, frameworks=("albef",))
loss_decrease_reward("itc+itm+itg", ("itc", "itm", "itg"), per_pair=False, frameworks=("blip2",))
loss_decrease_reward("itc+caption", ("itc", "caption"), per_pair=False, frameworks=("dual",))
loss_decrease_reward(
    "alignment",
    ("alignment",),
    from_training_loss=False,
    description="the rise of each pair's own image-text cosine (ours)",
)
