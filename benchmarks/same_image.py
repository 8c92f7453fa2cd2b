"""How many of the false negatives in GRIT / FALCON batches are pairs that share an image, and what masking them does.

    PYTHONPATH=. .venv/bin/python benchmarks/same_image.py --out runs/same-image --report docs/results.md   # resumable
    PYTHONPATH=. .venv/bin/python benchmarks/same_image.py --out /tmp/same-image --seeds 0 --only grit grit-mask

A pretraining set holds several pairs per image (COCO five, the shapes world a few), so a batch can
hold two captions of one image, each a negative of the other's image although it describes it.
Hard-negative composers chain the most similar text to an image, often another caption of it. On
the sweep's shapes world and budget (``benchmarks/shapes_sweep.py``'s FULL), this trains uniform,
GRIT and FALCON batches with ``pretrain.false_negatives.same_image: negative`` (the papers' behaviour) and GRIT and
FALCON with ``mask``, scores and audits them like the sweep, and measures with the oracle, over
every ordered in-batch (image, caption) pair of every batch the run trained on (the ITC
denominators), how many are false negatives and how many of those share the image. The audit
gives the same for the chain and ITM negatives. Writes ``same_image.csv`` / ``same_image.md`` to
OUT, and with ``--report`` the page's block between ``same-image:begin`` / ``same-image:end``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes_sweep as sweep  # noqa: E402  (the sweep's world, budget, runner and scoring)

VARIANTS: dict[str, tuple[str, list[str]]] = {
    "uniform": ("shapes-uniform", []),
    "grit": ("shapes-grit", []),
    "falcon": ("shapes-falcon", []),
    "grit-mask": ("shapes-grit", ["pretrain.false_negatives.same_image=mask"]),
    "falcon-mask": ("shapes-falcon", ["pretrain.false_negatives.same_image=mask"]),
}
"""Name -> (recipe, overrides): the papers' batches, and GRIT / FALCON with the same-image pairs masked."""

BEGIN, END = "<!-- same-image:begin -->", "<!-- same-image:end -->"


def in_batch_counts(run: Path) -> dict:
    """Over every ordered in-batch (image i, caption j != i) pair of the run's batch log: ``negatives``,
    ``false_negatives`` (the oracle says caption j describes image i), ``same_image`` (pairs i and j show the
    same image) and ``same_image_false_negatives``."""
    import numpy as np
    import torch

    from falcon_cli.data.datasets import pretrain_dataset
    from falcon_cli.data.shared_images import SharedImages
    from falcon_cli.data.spec import load_spec
    from falcon_cli.judges.oracle import in_batch_truth
    from falcon_cli.runtime.run_dir import read_manifest
    from falcon_cli.sampling.batch_log import read_batch_log

    spec = load_spec(read_manifest(run)["config"]["data"]["dataset"])
    dataset = pretrain_dataset(spec, transform=None)
    truth_of, shared = in_batch_truth(spec.resolve(spec.shapes_world), dataset.records), SharedImages(dataset.records)
    counts = dict.fromkeys(("negatives", "false_negatives", "same_image", "same_image_false_negatives"), 0)
    for _, batch in read_batch_log(run / "batches.parquet").groupby(["epoch", "step", "rank"], sort=False):
        pairs = torch.from_numpy(batch["pair_id"].to_numpy(np.int64, copy=True))
        truth, same = truth_of(pairs), shared.mask(pairs)
        counts["negatives"] += len(pairs) * (len(pairs) - 1)
        counts["false_negatives"] += int(truth.sum())
        counts["same_image"] += int(same.sum())
        counts["same_image_false_negatives"] += int((same & truth).sum())
    return counts


def measure(name: str, seed: int, out: Path, threads: int) -> dict:
    """Train, score and audit one (variant, seed) like the sweep (resumable), then count its in-batch pairs."""
    row = sweep.run_one(sweep.Variant(name), seed, out, sweep.FULL, threads, {}, recipe=VARIANTS[name])
    run = out / "runs" / f"{name}-s{seed}"
    cached = run / "same_image_counts.json"
    if not cached.exists():
        cached.write_text(json.dumps(in_batch_counts(run)))
    counts = json.loads(cached.read_text())
    audit = {r["kind"]: r for r in json.loads((run / sweep.AUDITED).read_text())["overall"]}
    row.update(
        {
            "in_batch_fn_rate": 100 * counts["false_negatives"] / counts["negatives"],
            "in_batch_same_share": 100 * counts["same_image_false_negatives"] / max(1, counts["false_negatives"]),
            "same_image_all_false": counts["same_image"] == counts["same_image_false_negatives"],
            "in_batch_same_rate": counts["same_image"] / max(1, counts["negatives"]) * 100,
        }
    )
    for kind in ("chain", "itm"):
        if kind in audit and audit[kind].get("same_image_share") is not None:
            row[f"{kind}_same_share"] = 100 * audit[kind]["same_image_share"]
    return row


COLUMNS = [
    ("in_batch_fn_rate", "in-batch FN %"),
    ("in_batch_same_rate", "same-image % of in-batch pairs"),
    ("in_batch_same_share", "same-image % of in-batch FNs"),
    ("fn_rate_chain", "chain FN %"),
    ("chain_same_share", "same-image % of chain FNs"),
    ("fn_rate_itm", "ITM FN %"),
    ("itm_same_share", "same-image % of ITM FNs"),
    ("R@1", "R@1"),
    ("oracle_R@1", "FN-aware R@1"),
]
"""The table: results column -> header (mean ± std over the seeds)."""


def table_markdown(table) -> str:
    """One row per variant (in :data:`VARIANTS` order), mean ± std over its seeds."""
    lines = ["| batches | seeds | " + " | ".join(h for _, h in COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for name in VARIANTS:
        rows = table[table["method"] == name]
        if rows.empty:
            continue
        cells = []
        for key, _ in COLUMNS:
            values = rows[key].dropna() if key in rows else []
            cells.append(
                "—"
                if len(values) == 0
                else (f"{values.mean():.1f}" if len(values) == 1 else f"{values.mean():.1f} ± {values.std():.1f}")
            )
        lines.append(f"| {name} | {sweep.seeds_phrase(rows['seed']).split(' ', 1)[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import pandas as pd

    args = sweep.sweep_parser(__doc__, list(VARIANTS), "same-image").parse_args()

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    if not (out / "world" / "world.json").exists():
        sweep.falcon(*sweep.FULL.world_args(out), log=out / "world.log", threads=os.cpu_count() or 1)
    start = time.perf_counter()
    todo = [(name, seed) for seed in args.seeds for name in (args.only or VARIANTS)]
    rows = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for (name, seed), future in [((n, s), pool.submit(measure, n, s, out, threads)) for n, s in todo]:
            rows.append(future.result())
            print(
                f"[{time.perf_counter() - start:6.0f} s] {name} seed {seed}: same-image share of in-batch FNs "
                f"{rows[-1]['in_batch_same_share']:.1f}%, R@1 {rows[-1]['R@1']:.1f}",
                flush=True,
            )
    table = pd.DataFrame(rows)
    table.to_csv(out / "same_image.csv", index=False)
    markdown = table_markdown(table)
    (out / "same_image.md").write_text(markdown)
    print(markdown)
    if not table["same_image_all_false"].all():
        raise SystemExit("a pair sharing an image was not a false negative by the oracle: the measurement is wrong")
    if args.report:
        command = "PYTHONPATH=. .venv/bin/python benchmarks/same_image.py " + " ".join(sys.argv[1:])
        sweep.replace_block(
            args.report.resolve(),
            BEGIN,
            END,
            [
                "<!-- Generated by benchmarks/same_image.py --report; edit outside the markers. -->",
                "",
                f"**Command:** `{command}`  ",
                f"**Budget:** the sweep's (albef-tiny from scratch, {sweep.FULL.size}-pixel world of "
                f"{sweep.FULL.images} images, {sweep.FULL.epochs} epochs, B = {sweep.FULL.batch}, "
                f"|M| = {sweep.FULL.spaces['medium']}); mean ± std over {sweep.seeds_phrase(table['seed'])}.",
                "",
                markdown,
            ],
        )


if __name__ == "__main__":
    main()
