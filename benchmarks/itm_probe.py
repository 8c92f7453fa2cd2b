"""Does a run's fusion encoder read the image, does its ITM head tell matches apart, and can it learn to?

    PYTHONPATH=. .venv/bin/python benchmarks/itm_probe.py runs/phase/runs/coco-like/uniform-s0
    PYTHONPATH=. .venv/bin/python benchmarks/itm_probe.py RUN --steps 800 --lr 3e-4               # can it learn?
    PYTHONPATH=. .venv/bin/python benchmarks/itm_probe.py RUN --steps 800 --lr 3e-4 --start scratch

An ALBEF run's ITM loss can sit at the value of a head that has learned nothing (the entropy of one match in three,
0.637) while its ITC retrieval is good. This probe separates the possible causes on the run's own test split, with
the run's encoders frozen:

1. **The run's head as trained**: the chance that its match probability ranks a caption's own image above another
   image (AUC), for a random other image and for the ITC's hardest one; the ITC's own AUC on the same pairs beside
   it. An ITM head that has learned nothing scores 0.5.
2. **Does the fusion read the image?** MLM accuracy on the fused captions with their own image against a random
   one (the same masks). Equal accuracies: the cross-attention carries nothing.
3. **Can the fusion learn ITM here?** (``--steps N``) The fusion encoder and ITM head (as trained, or re-initialised
   with ``--start scratch``) are trained on cached encoder tokens of three quarters of the test images, with the
   training objective's own mining (:func:`~falcon_cli.objectives.itm.hardest_negatives`, or uniform random
   negatives with ``--negatives random``) and loss, at a constant learning rate; the AUCs are measured on the other
   quarter every ``N / 8`` steps. The encoders are frozen, so this asks only whether the fusion can learn the task on
   this world and how many steps its plateau lasts, not what a run reaches.

Writes ``--out FILE`` (JSON) when given. Encoding the split is cached beside it (``--cache``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.phase_sweep import ITM_PRIOR  # noqa: E402  (0.637: what a head that has learned nothing scores)
from falcon_cli.audit.report import rank_auc  # noqa: E402
from falcon_cli.objectives.itm import hardest_negatives, itm_loss, itm_pair_indices  # noqa: E402
from falcon_cli.objectives.mlm import MlmMask  # noqa: E402

MIN_IMAGES_TO_TRAIN = 8
"""``--steps`` trains on three quarters of the test images and measures on the rest, at least two of them."""


def other_index(n: int, generator: torch.Generator) -> torch.Tensor:
    """For each of ``n`` positions a uniformly drawn other position (int64 [n])."""
    return (torch.arange(n) + torch.randint(1, n, (n,), generator=generator)) % n


def probe_pairs(
    similarity: torch.Tensor, img2txt: list[list[int]], images: torch.Tensor, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """For each image of ``images`` its first caption and two other images of ``images``: a random one and the one
    whose ITC similarity to the caption is highest (``similarity`` [n_images, n_texts]). Int64 [n] each."""
    texts = torch.tensor([img2txt[i][0] for i in images.tolist()])
    n = len(images)
    random_other = images[other_index(n, generator)]
    rows = similarity[images][:, texts].t().clone()  # [caption, candidate image]
    rows.fill_diagonal_(float("-inf"))
    return {"image": images, "text": texts, "random": random_other, "hardest": images[rows.argmax(dim=1)]}


@torch.no_grad()
def match_probability(fusion, head, e, images: torch.Tensor, texts: torch.Tensor, batch: int = 128) -> torch.Tensor:
    """P(match) of the ITM head for the (image, text) pairs, from the cached encoder tokens of ``e``."""
    out = []
    for s in range(0, len(images), batch):
        out.append(itm_logits(fusion, head, e, images[s : s + batch], texts[s : s + batch]).float().softmax(-1)[:, 1])
    return torch.cat(out)


def itm_logits(fusion, head, e, images: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
    """ITM logits [P, 2] of P pairs through ``fusion`` (text tokens cross-attending to image tokens) and ``head``."""
    mask = e.text_mask[texts]
    length = int(mask.sum(dim=1).max())
    fused = fusion(e.text_tokens[texts, :length].float(), mask[:, :length], e.image_tokens[images].float())
    return head(fused[:, 0])


def auc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """The chance a positive pair scores above a negative one (ties half): :func:`rank_auc`."""
    scores = torch.cat([positive, negative]).double().numpy()
    labels = np.r_[np.ones(len(positive), bool), np.zeros(len(negative), bool)]
    return rank_auc(scores, labels)


def wins(own: torch.Tensor, other: torch.Tensor) -> float:
    """The share of captions whose own image scores above their other image (ties half): the comparison a
    re-ranking makes within one query, where :func:`auc` pools every caption's scores."""
    return float(((own > other).double() + 0.5 * (own == other).double()).mean())


def matching_aucs(fusion, head, e, pairs: dict[str, torch.Tensor]) -> dict[str, float]:
    """ITM AUC of each caption's own image against a random and against the ITC-hardest other image, and the ITC's;
    ``*_wins_*``: the same comparisons caption by caption (:func:`wins`)."""
    was_training = fusion.training
    fusion.eval()
    itm = {k: match_probability(fusion, head, e, pairs[k], pairs["text"]) for k in ("image", "random", "hardest")}
    fusion.train(was_training)
    # the ITC cosine of each pair alone (the split's whole similarity matrix is not needed here)
    itc = {k: (e.image_feat[pairs[k]] * e.text_feat[pairs["text"]]).sum(-1) for k in ("image", "random", "hardest")}
    return {
        "itm_auc_random": auc(itm["image"], itm["random"]),
        "itm_auc_hardest": auc(itm["image"], itm["hardest"]),
        "itc_auc_random": auc(itc["image"], itc["random"]),
        "itc_auc_hardest": auc(itc["image"], itc["hardest"]),
        "itm_wins_random": wins(itm["image"], itm["random"]),
        "itm_wins_hardest": wins(itm["image"], itm["hardest"]),
        "itc_wins_hardest": wins(itc["image"], itc["hardest"]),
    }


@torch.no_grad()
def mlm_with_and_without_image(
    model, tokenizer, e, pairs: dict[str, torch.Tensor], probability: float = 0.3, seed: int = 0
) -> dict[str, float]:
    """MLM accuracy of the fused captions with their own image and with a random one, the same masks for both."""
    was_training = model.training
    model.eval()
    texts = pairs["text"]
    ids, mask = e.text_ids[texts], e.text_mask[texts]
    m = MlmMask.sample(
        ids,
        mask,
        vocab_size=len(tokenizer),
        mask_token_id=tokenizer.mask_token_id,
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        probability=probability,
        generator=torch.Generator().manual_seed(seed),
    )
    selected = m.labels != -100
    text_tokens, _ = model.encode_text(m.masked_ids, mask)
    out = {}
    for name, images in (("mlm_own_image", pairs["image"]), ("mlm_random_image", pairs["random"])):
        fused = model.fuse(text_tokens, mask, e.image_tokens[images].to(text_tokens.dtype))
        out[name] = float((model.mlm_logits(fused[selected]).argmax(-1) == m.labels[selected]).float().mean())
    model.train(was_training)
    return out


def train_fusion(
    fusion,
    head,
    e,
    img2txt: list[list[int]],
    train_images: torch.Tensor,
    eval_pairs: dict[str, torch.Tensor],
    *,
    steps: int,
    lr: float,
    batch: int = 64,
    negatives: str = "hardest",
    seed: int = 0,
    evaluations: int = 8,
    log=print,
) -> list[dict]:
    """Train ``fusion`` and ``head`` on ITM over cached encoder tokens (the encoders stay frozen): batches of
    ``batch`` distinct images of ``train_images``, one random caption each, with the objective's hardest in-batch
    negatives by ITC or uniform random ones, at a constant ``lr`` (AdamW). Returns the learning curve: the mean
    loss since the last point and :func:`matching_aucs` on ``eval_pairs``, ``evaluations`` points."""
    params = [*fusion.parameters(), *head.parameters()]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.02)
    g = torch.Generator().manual_seed(seed)
    sims = e.similarity()
    fusion.train()
    curve = [{"step": 0, "loss": None, **matching_aucs(fusion, head, e, eval_pairs)}]
    every, losses, start = max(1, steps // evaluations), [], time.time()
    for step in range(1, steps + 1):
        images = train_images[torch.randperm(len(train_images), generator=g)[:batch]]
        texts = torch.tensor(
            [img2txt[i][int(torch.randint(len(img2txt[i]), (1,), generator=g))] for i in images.tolist()]
        )
        b = len(images)
        if negatives == "hardest":
            s = sims[images][:, texts]
            neg_text, neg_image = hardest_negatives(s, s.t())
        else:
            neg_text, neg_image = other_index(b, g), other_index(b, g)
        pairs = itm_pair_indices(neg_text, neg_image)
        logits = itm_logits(fusion, head, e, images[pairs.image_index], texts[pairs.text_index])
        loss = itm_loss(logits[:b], logits[b:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % every == 0 or step == steps:
            point = {"step": step, "loss": float(np.mean(losses)), **matching_aucs(fusion, head, e, eval_pairs)}
            losses = []
            curve.append(point)
            log(
                f"step {step:>6}: ITM loss {point['loss']:.3f}  "
                f"AUC against a random image {point['itm_auc_random']:.3f}, "
                f"against the ITC-hardest {point['itm_auc_hardest']:.3f}  ({time.time() - start:.0f} s)"
            )
    return curve


def encode(run: Path, world: str | None, cache: Path | None):
    """The run's model and tokenizer, and its test split encoded once (``cache``: reused when present)."""
    import yaml

    from falcon_cli.data.datasets import retrieval_dataset
    from falcon_cli.data.spec import load_spec
    from falcon_cli.data.tokenizer import load_run_tokenizer
    from falcon_cli.data.transforms import build_transform
    from falcon_cli.evaluation.scoring import embed_split
    from falcon_cli.models.pretrained import find_checkpoint, model_from_checkpoint

    config = yaml.safe_load((run / "config.yaml").read_text())
    model = model_from_checkpoint(find_checkpoint(run, "itm_probe.py RUN")).eval()
    if not hasattr(model, "fusion_encoder"):
        raise SystemExit(
            f"{run}: the probe needs an ALBEF run (a fusion encoder and an ITM head), got {type(model).__name__}"
        )
    tokenizer = load_run_tokenizer(run, config["name"])
    if cache is not None and cache.exists():
        e, img2txt = torch.load(cache, weights_only=False)
        return model, tokenizer, e, img2txt
    spec = load_spec(world or config["data"]["dataset"])
    dataset = retrieval_dataset(spec, "test", build_transform("test", model.config.image_size))
    e = embed_split(model, dataset, tokenizer, torch.device("cpu"))
    img2txt = [dataset.img2txt[i] for i in range(len(dataset.img2txt))]
    if cache is not None:
        torch.save((e, img2txt), cache)
    return model, tokenizer, e, img2txt


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="An ALBEF run directory (its latest checkpoint and test split).")
    parser.add_argument("--world", help="The dataset directory, when the run's recorded one has moved.")
    parser.add_argument("--images", type=int, default=0, help="Test images to use (0 = all).")
    parser.add_argument(
        "--steps", type=int, default=0, help="Train the fusion and ITM head this many steps (0 = probe only)."
    )
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--negatives", choices=["hardest", "random"], default="hardest")
    parser.add_argument(
        "--start",
        choices=["trained", "scratch"],
        default="trained",
        help="Train the run's fusion and head as they are, or re-initialised (BERT init).",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, help="Where to keep the encoded test split between calls.")
    parser.add_argument("--out", type=Path, help="Write the results here (JSON).")
    args = parser.parse_args(argv)
    if not (args.run / "config.yaml").exists():
        raise SystemExit(f"{args.run}: not a run directory (no config.yaml); give a pretrained ALBEF run")

    torch.manual_seed(args.seed)
    model, tokenizer, e, img2txt = encode(args.run, args.world, args.cache)
    n = len(img2txt) if args.images <= 0 else min(args.images, len(img2txt))
    if n < (MIN_IMAGES_TO_TRAIN if args.steps else 2):
        raise SystemExit(
            f"{args.run}: {n} test images; the probe needs at least 2"
            + (f", and --steps at least {MIN_IMAGES_TO_TRAIN} (a quarter held out)" if args.steps else "")
            + " (a larger world, or --images 0)"
        )
    g, similarity = torch.Generator().manual_seed(args.seed), e.similarity()
    everything = probe_pairs(similarity, img2txt, torch.arange(n), g)
    result = {
        "run": str(args.run),
        "images": n,
        "itm_prior": ITM_PRIOR,
        **matching_aucs(model.fusion_encoder, model.itm_head, e, everything),
        **mlm_with_and_without_image(model, tokenizer, e, everything, seed=args.seed),
    }
    print(f"{args.run}: {n} test images, one caption each")
    print(
        f"  ITM head as trained: AUC against a random image {result['itm_auc_random']:.3f}, against the ITC-hardest "
        f"{result['itm_auc_hardest']:.3f} (ITC: {result['itc_auc_random']:.3f}, {result['itc_auc_hardest']:.3f})"
    )
    print(
        f"  caption by caption, its own image above a random one: ITM {result['itm_wins_random']:.3f}; above the "
        f"ITC-hardest: ITM {result['itm_wins_hardest']:.3f}, ITC {result['itc_wins_hardest']:.3f}"
    )
    print(
        f"  MLM accuracy with the caption's own image {result['mlm_own_image']:.3f}, "
        f"with a random image {result['mlm_random_image']:.3f}"
    )
    if args.steps:
        if args.start == "scratch":
            from falcon_cli.models.bert import init_bert_weights

            init_bert_weights(model.fusion_encoder)
            model.itm_head.reset_parameters()
        split = int(0.75 * n)
        held_out = probe_pairs(similarity, img2txt, torch.arange(split, n), g)
        print(
            f"  training the fusion and ITM head ({args.start}, {args.negatives} negatives, lr {args.lr:g}) on "
            f"{split} images, measured on {n - split}:"
        )
        result.update(
            start=args.start,
            negatives=args.negatives,
            lr=args.lr,
            curve=train_fusion(
                model.fusion_encoder,
                model.itm_head,
                e,
                img2txt,
                torch.arange(split),
                held_out,
                steps=args.steps,
                lr=args.lr,
                negatives=args.negatives,
                seed=args.seed,
                log=lambda line: print("  " + line, flush=True),
            ),
        )
    if args.out:
        from falcon_cli.artifacts.atomic import write_json

        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
