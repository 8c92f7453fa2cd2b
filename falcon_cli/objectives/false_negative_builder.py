"""The run's false-negative method, found by name in the registry (:mod:`falcon_cli.registry`; falcon's own in
``falcon_cli/methods/``) and built with every input checked before any training: MAFA's judge, SRCL's auxiliary
features, GloFND's per-pair thresholds, DiHT's weights, a plugin's, or the framework's plain ITC
(``false_negatives.method: none``, built with the objective). On a shapes world every method but the
plain ITC also gets the oracle, so what it flags (MAFA, GloFND) or how it weights (SRCL, DiHT) can be measured against
the truth."""

from __future__ import annotations

from typing import Any, Callable

import torch

from falcon_cli.data.shared_images import SharedImages
from falcon_cli.errors import FalconError
from falcon_cli.judges.oracle import in_batch_truth
from falcon_cli.objectives.false_negatives import FalseNegatives
from falcon_cli.registry import FALSE_NEGATIVE_METHODS, MethodContext


def build_false_negatives(
    config: Any, spec: Any, dataset: Any, device: torch.device, run: Any, *, warn: Callable[[str], None] = print
) -> tuple[FalseNegatives | None, Callable | None]:
    """The run's false-negative method (``config.pretrain.false_negatives.method``, found in the registry;
    ``none``: None, the framework's plain ITC, which :func:`falcon_cli.frameworks.build_objective` supplies), every
    input checked now, and on a shapes world ``truth(pair_ids) -> bool [B, B]`` (image i truly described by caption
    j, off the diagonal) for a method whose decisions are scored against it (``scored``); None elsewhere. ``run``:
    the run directory (SRCL's default features are its ``embeddings/embeddings.h5``); ``warn``: prints a warning
    line."""
    p = config.pretrain
    if p.false_negatives.method == "none":
        return None, None
    method = FALSE_NEGATIVE_METHODS.get(p.false_negatives.method)
    world = spec.resolve(spec.shapes_world) if spec.shapes_world is not None else None
    truth = in_batch_truth(world, dataset.records) if world is not None and method.scored else None
    context = MethodContext(
        pretrain=p,
        dataset=dataset,
        spec=spec,
        data_dir=config.data.dataset,
        device=device,
        run_path=run.path,
        world=world,
        warn=warn,
    )
    built = method.build(p.false_negatives.settings(), context)
    if not isinstance(built, FalseNegatives):
        raise FalconError(
            f"false-negative method '{method.name}' ({FALSE_NEGATIVE_METHODS.origins[method.name]}): its build "
            f"returned a {type(built).__name__}, not a falcon_cli.objectives.false_negatives.FalseNegatives"
        )
    return built, truth


def excluded_negatives(
    settings: Any, spec: Any, records: Any, device: torch.device | str = "cpu", *, check: bool = True, itm: bool = False
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``exclude(pair_ids) -> bool [B, B]`` on ``device``: the in-batch pairs (rows images, columns texts, off the
    diagonal) kept out of the ITC denominators and ITM mining, or None when none are (``settings``: the
    ``pretrain.false_negatives`` section). ``same_image: mask``: pairs that show the same image; ``oracle: mask``: every
    pair the shapes oracle says truly matches (a superset: another caption of an image describes it). The pretrain stage
    masks with it and the audit replays the same ITM mining. ``check``: fail on an unknown pair id (the training
    loop, whose ids come from the dataset itself, skips that host synchronisation). ``itm``: the pairs ITM's mining
    skips, which ``oracle: mask_itc`` leaves out (its mask is the ITC's alone)."""
    oracle = settings.oracle == "mask" or (settings.oracle == "mask_itc" and not itm)
    if oracle:  # (it holds every same-image pair too, so it stands for both)
        if spec.shapes_world is None:
            raise FalconError(
                f"pretrain.false_negatives.oracle={settings.oracle}: the dataset in {spec.base_dir} is not "
                "a shapes world (its dataset.yaml names no shapes_world), so no oracle knows its false negatives; set "
                "pretrain.false_negatives.oracle=keep"
            )
        truth = in_batch_truth(spec.resolve(spec.shapes_world), records)  # (on the host: a diagnostic, not for speed)
        return lambda ids: truth(ids.cpu()).to(device)
    if settings.same_image == "mask":
        shared = SharedImages(records, device)
        return lambda ids: shared.mask(ids, check=check)
    return None


__all__ = ["build_false_negatives", "excluded_negatives"]
