"""The run's false-negative method, built from the pretrain settings with every input checked before any
training: MAFA's judge, SRCL's auxiliary features, GloFND's per-pair thresholds, DiHT's weights, or the
framework's plain ITC (``false_negatives: none``, built with the objective). On a shapes world every method but the
plain ITC also gets the oracle, so what it flags (MAFA, GloFND) or how it weights (SRCL, DiHT) can be measured against
the truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from falcon_cli.artifacts.embeddings import check_fingerprint, read_embeddings
from falcon_cli.data.pairs import records_fingerprint
from falcon_cli.data.shared_images import SharedImages
from falcon_cli.errors import FalconError
from falcon_cli.judges import JudgedPair, load_judge
from falcon_cli.judges.oracle import in_batch_truth
from falcon_cli.judges.pairs import DatasetPairs
from falcon_cli.objectives import false_negatives as methods
from falcon_cli.sampling.cache import EmbeddingCache

SCORED_METHODS = ("mafa", "glofnd", "srcl", "diht")
"""The methods whose decisions about negatives are scored against the oracle's truth: MAFA and GloFND flag pairs
as false negatives (converted, dropped), SRCL and DiHT weight every negative."""


def build_false_negatives(
    config: Any, spec: Any, dataset: Any, device: torch.device, run: Any, *, warn: Callable[[str], None] = print
) -> tuple[methods.FalseNegatives | None, Callable | None]:
    """The run's false-negative method (``config.pretrain.false_negatives``; ``none``: None, the framework's plain
    ITC, which :func:`falcon_cli.frameworks.build_objective` supplies), every input checked now, and on a shapes
    world ``truth(pair_ids) -> bool [B, B]`` (image i truly described by caption j, off the diagonal) for the
    methods scored against it (:data:`SCORED_METHODS`); None elsewhere. ``run``: the run directory (SRCL's default
    features are its ``embeddings/embeddings.h5``); ``warn``: prints a warning line."""
    p = config.pretrain
    world = spec.resolve(spec.shapes_world) if spec.shapes_world is not None else None
    truth = (
        in_batch_truth(world, dataset.records) if world is not None and p.false_negatives in SCORED_METHODS else None
    )
    if p.false_negatives == "diht":
        return methods.Diht(beta=p.diht.beta, alpha=p.diht.alpha), truth
    if p.false_negatives == "srcl":
        path = (
            Path(p.srcl.aux_embeddings)
            if p.srcl.aux_embeddings is not None
            else run.path / "embeddings" / "embeddings.h5"
        )
        if not path.exists():
            raise FalconError(
                f"{path}: not found; SRCL needs the frozen auxiliary model's features of every pair: make them "
                "with `falcon embed` (embed.split=pretrain) or set pretrain.srcl.aux_embeddings=PATH"
            )
        aux = read_embeddings(path)
        warning = check_fingerprint(
            path, aux.attrs, records_fingerprint(dataset.records, spec.base_dir), config.data.dataset
        )
        if warning is not None:
            warn(warning)
        cache = EmbeddingCache(torch.tensor(dataset.pair_ids, dtype=torch.long), aux.image.shape[1], device=device)
        cache.load(path, aux)
        missing = cache.pair_ids[~cache.filled]
        if len(missing):
            raise FalconError(
                f"{path}: no features for pair_id {int(missing.min())} ({len(missing)} pairs); embed this "
                "dataset's pretraining split (embed.split=pretrain)"
            )
        return methods.Srcl(cache.get, delta=p.srcl.delta, until=p.srcl.mix_until), truth
    if p.false_negatives == "glofnd":
        glofnd = methods.Glofnd(
            dataset.pair_ids,
            alpha=p.glofnd.alpha,
            lr=p.glofnd.lr,
            start_epoch=p.glofnd.start_epoch,
            adam_step=p.glofnd.adam_step,
        )
        glofnd.thresholds.to(device)
        return glofnd, truth
    if p.false_negatives == "mafa":
        return _mafa(p, world, dataset), truth
    return None, truth


def _mafa(p: Any, world: Any, dataset: Any) -> methods.Mafa:
    """MAFA with its connection discriminator: a judge scoring each (image, caption) pair MAFA asks about."""
    m = p.mafa
    if m.judge == "checkpoint" and m.judge_model is None:
        raise FalconError(
            "pretrain.mafa.judge=checkpoint needs pretrain.mafa.judge_model=DIR: a falcon run or "
            "checkpoint directory (the frozen connection discriminator)"
        )
    judge = load_judge(
        m.judge,
        model=m.judge_model,
        world=world,
        run=m.judge_model,
        device=p.device,
        fp16=m.fp16,
        batch_size=m.batch_size,
        what="pretrain.mafa.judge_model",
    )
    pairs = DatasetPairs(dataset)

    def discriminator(image_pairs: torch.Tensor, text_pairs: torch.Tensor, epoch: int) -> torch.Tensor:
        judged = []
        for image_pair, text_pair in zip(image_pairs.tolist(), text_pairs.tolist()):
            image, text = pairs(epoch, image_pair), pairs(epoch, text_pair)
            judged.append(
                JudgedPair(image=image.image, caption=text.caption, image_id=image.image_id, caption_id=text.caption_id)
            )
        return torch.from_numpy(judge.score(judged)).float()

    return methods.Mafa(discriminator, high=m.high, low=m.low, smoothing=m.smoothing, mlm_pairs=m.mlm_pairs)


def excluded_negatives(
    p: Any, spec: Any, records: Any, device: torch.device | str = "cpu", *, check: bool = True, itm: bool = False
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``exclude(pair_ids) -> bool [B, B]`` on ``device``: the in-batch pairs (rows images, columns texts, off the
    diagonal) kept out of the ITC denominators and ITM mining, or None when none are (``p``: the pretrain
    settings). ``same_image: mask``: pairs that show the same image; ``oracle_negatives: mask``: every pair the
    shapes oracle says truly matches (a superset: another caption of an image describes it). The pretrain stage
    masks with it and the audit replays the same ITM mining. ``check``: fail on an unknown pair id (the training
    loop, whose ids come from the dataset itself, skips that host synchronisation). ``itm``: the pairs ITM's mining
    skips, which ``oracle_negatives: mask_itc`` leaves out (its mask is the ITC's alone)."""
    oracle = p.oracle_negatives == "mask" or (p.oracle_negatives == "mask_itc" and not itm)
    if oracle:  # (it holds every same-image pair too, so it stands for both)
        if spec.shapes_world is None:
            raise FalconError(
                f"pretrain.oracle_negatives={p.oracle_negatives}: the dataset in {spec.base_dir} is not a shapes world "
                "(its dataset.yaml names no shapes_world), so no oracle knows its false negatives; set "
                "pretrain.oracle_negatives=keep"
            )
        truth = in_batch_truth(spec.resolve(spec.shapes_world), records)  # (on the host: a diagnostic, not for speed)
        return lambda ids: truth(ids.cpu()).to(device)
    if p.same_image == "mask":
        shared = SharedImages(records, device)
        return lambda ids: shared.mask(ids, check=check)
    return None


__all__ = ["SCORED_METHODS", "build_false_negatives", "excluded_negatives"]
