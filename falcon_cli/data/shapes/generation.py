"""Generate the content of a shapes world in memory: scenes, splits, captions, VQA questions,
NLVR2 statements, and the oracle's verdict on every caption (``world.py`` orchestrates,
``writing.py`` puts it on disk).

Determinism: every random choice comes from a generator seeded by ``(seed, stream, index)``
(see ``seeding.py``), so the content is the same whether the per-image work (rendering,
captions, questions) runs in one process or many.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from falcon_cli.data.shapes import formats
from falcon_cli.data.shapes import logical_forms as lfs
from falcon_cli.data.shapes.captions import sample_captions
from falcon_cli.data.shapes.config import CAPTION_KINDS, SPLITS, ShapesConfig, assign_splits
from falcon_cli.data.shapes.density import CaptionJudgement, density_statistics, judge_captions
from falcon_cli.data.shapes.oracle import scene_index
from falcon_cli.data.shapes.questions import sample_questions
from falcon_cli.data.shapes.render import png_bytes, render_scene
from falcon_cli.data.shapes.scene import SceneArrays, near_miss, sample_scene, scene_objects
from falcon_cli.data.shapes.seeding import (
    STREAM_CAPTIONS,
    STREAM_EXTRA_PIXELS,
    STREAM_EXTRA_SCENES,
    STREAM_NEAR_MISSES,
    STREAM_PIXELS,
    STREAM_QUESTIONS,
    STREAM_SCENES,
    STREAM_STATEMENTS,
    stream_generator,
    stream_random,
)
from falcon_cli.data.shapes.statements import make_statement
from falcon_cli.data.shapes.vocabulary import POSITIONS
from falcon_cli.runtime.progress import track

PARALLEL_MIN_IMAGES = 400
"""Below this many images the per-image work runs in-process (a pool costs more than it saves)."""
CHUNK = 250
"""Images per job: small enough for a smooth progress bar, big enough to amortise IPC."""


@dataclass
class WorldContent:
    """Everything a world holds except the pixels (which are already written as PNGs)."""

    config: ShapesConfig
    files: list[str]
    """Image path per image id, relative to the world directory."""
    scenes: SceneArrays
    image_split: np.ndarray
    """Split code (index into ``SPLITS``) per image id."""
    captions: list[dict]
    """Per caption: caption_id, image_id, index, split (code), kind, logical_form, key, text, paraphrased."""
    caption_kind: np.ndarray
    distinct_forms: int
    judgement: CaptionJudgement
    density: dict
    duplicate_captions: dict
    """Captions that repeat another caption of the same image: ``same_text``, ``same_logical_form``, ``images``."""
    questions: list[list[dict]]
    """Per image: ``{"type", "question", "answer", "answers"}`` items (existence already resolved to yes or no)."""
    statements: dict[str, list[dict]]
    """Per split (train / val / test): NLVR2 entries."""


def _image_job(job: tuple) -> tuple[int, list[list[dict]], list[list[dict]]]:
    """Per-image work for images ``start..start+len``: render and write the PNG, sample captions
    and VQA questions. Runs in a worker process; depends only on its arguments."""
    start, shape, color, size, config, paths = job
    weights = config.caption_mix.weights()
    captions, questions = [], []
    for k in range(len(paths)):
        i = start + k
        image = render_scene(
            shape[k],
            color[k],
            size[k],
            stream_generator(config.seed, STREAM_PIXELS, i),
            image_size=config.size,
            background_noise=config.background_noise,
        )
        with open(paths[k], "wb") as handle:  # inside the temporary world dir: the final rename makes it atomic
            handle.write(png_bytes(image))
        objects = scene_objects(shape[k], color[k], size[k])
        captions.append(
            sample_captions(
                objects,
                stream_random(config.seed, STREAM_CAPTIONS, i),
                count=config.captions_per_image,
                kind_weights=weights,
                paraphrase_prob=config.paraphrase_prob,
                min_attributes=config.min_attributes,
                scene_captions=config.scene_captions,
            )
        )
        questions.append(
            sample_questions(
                objects,
                stream_random(config.seed, STREAM_QUESTIONS, i),
                count=config.vqa_questions_per_image,
                num_shapes=config.num_shapes,
                num_colors=config.num_colors,
                variation=config.vqa_answer_variation,
            )
        )
    return start, captions, questions


@contextlib.contextmanager
def _image_results(scenes: SceneArrays, config: ShapesConfig, paths: list[Path], workers: int):
    """Yield an iterator over :func:`_image_job` results, one per chunk of images, in image order.

    With a process pool the jobs start at once in the background, so the caller can do
    other work (NLVR2 statements) before it consumes the results.
    """
    jobs = [
        (
            s,
            scenes.shape[s : s + CHUNK],
            scenes.color[s : s + CHUNK],
            scenes.size[s : s + CHUNK],
            config,
            paths[s : s + CHUNK],
        )
        for s in range(0, len(scenes), CHUNK)
    ]
    if workers <= 1 or len(scenes) < PARALLEL_MIN_IMAGES:
        yield (_image_job(job) for job in jobs)
        return
    # fork keeps start-up cheap; each job only reads its arguments and writes its own files.
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    with multiprocessing.get_context(method).Pool(workers) as pool:
        yield pool.imap(_image_job, jobs)


def _make_statements(
    config: ShapesConfig, image_split: np.ndarray, objects: list[list[dict]], files: list[str]
) -> dict[str, list[dict]]:
    """NLVR2 entries per split: labels alternate True/False, so each split is exactly balanced."""
    statements: dict[str, list[dict]] = {}
    for code, split in enumerate(SPLITS):
        rows = np.flatnonzero(image_split == code)
        total = 2 * math.ceil(config.nlvr2_statements_per_image * rows.size / 2)
        entries = []
        for k in track(range(total), f"NLVR2 {split} statements"):
            label = k % 2 == 0
            left, right, _statement, text = make_statement(
                label,
                rows,
                objects,
                stream_random(config.seed, STREAM_STATEMENTS, code, k),
                num_shapes=config.num_shapes,
                num_colors=config.num_colors,
            )
            entries.append(formats.nlvr2_entry(split, k, files[left], files[right], text, label))
        statements[split] = entries
    return statements


def _balance_existence(questions: list[list[dict]], image_split: np.ndarray) -> None:
    """Pick the yes or no version of each existence question, alternating within each split."""
    counters = [0] * len(SPLITS)
    for image_id, items in enumerate(questions):
        split = int(image_split[image_id])
        for j, item in enumerate(items):
            if item["type"] == "exists":
                chosen = item["yes" if counters[split] % 2 == 0 else "no"]
                counters[split] += 1
                items[j] = {"type": "exists", **chosen}


def _sample_scenes(config: ShapesConfig) -> SceneArrays:
    """Every scene of the world. With ``near_misses`` = k, images come in families of k + 1: a drawn
    scene, then k near misses of it (each differs from it in one thing; see :func:`scene.near_miss`)."""
    n, family_size = config.images, config.near_misses + 1
    arrays = [np.empty((n, len(POSITIONS)), dtype=np.int8) for _ in range(3)]
    vocabulary = dict(num_shapes=config.num_shapes, num_colors=config.num_colors)
    family: list[tuple] = []
    for i in track(range(n), "sampling scenes"):
        index, member = divmod(i, family_size)
        if member == 0:
            drawn = sample_scene(
                stream_random(config.seed, STREAM_SCENES, index),
                min_objects=config.min_objects,
                max_objects=config.max_objects,
                **vocabulary,
            )
            family = [drawn]
        else:
            drawn = near_miss(
                family[0], stream_random(config.seed, STREAM_NEAR_MISSES, index, member), avoid=family, **vocabulary
            )
            family.append(drawn)
        for arr, row in zip(arrays, drawn):
            arr[i] = row
    return SceneArrays(*arrays)


def generate_content(config: ShapesConfig, root: Path, workers: int) -> WorldContent:
    """Sample the world and write its PNGs under ``root/images``; return everything else in memory."""
    n = config.images
    width = max(6, len(str(n - 1)))
    files = [f"images/{i:0{width}d}.png" for i in range(n)]
    (root / "images").mkdir(parents=True)

    scenes = _sample_scenes(config)
    objects = [scene_objects(scenes.shape[i], scenes.color[i], scenes.size[i]) for i in range(n)]
    image_split = assign_splits(config)

    with _image_results(scenes, config, [root / f for f in files], workers) as results:
        statements = _make_statements(config, image_split, objects, files)  # overlaps with the image workers
        chunks = list(track(results, "images, captions, questions", total=math.ceil(n / CHUNK)))
    questions = [q for _, _, chunk in chunks for q in chunk]
    _balance_existence(questions, image_split)

    captions: list[dict] = []
    train, kept = SPLITS.index("train"), config.train_captions_per_image
    for i, drawn in enumerate(c for _, chunk, _ in chunks for c in chunk):
        if kept is not None and image_split[i] == train:
            drawn = drawn[:kept]  # (every image draws all its captions, so the kept ones are those of the full world)
        for k, caption in enumerate(drawn):
            caption.update(caption_id=len(captions), image_id=i, index=k, split=int(image_split[i]))
            captions.append(caption)

    # The oracle judges every caption against every image, once per distinct logical form.
    keys, caption_form = lfs.factorize(c["key"] for c in captions)
    first: dict[int, int] = {}
    for row, form in enumerate(caption_form.tolist()):
        first.setdefault(form, row)
    forms = [captions[first[f]]["logical_form"] for f in range(len(keys))]
    caption_split = np.array([c["split"] for c in captions], dtype=np.int8)
    caption_image = np.array([c["image_id"] for c in captions], dtype=np.int64)
    caption_kind = np.array([CAPTION_KINDS.index(c["kind"]) for c in captions], dtype=np.int8)
    judgement = judge_captions(
        scene_index(scenes),
        image_split,
        forms,
        caption_form,
        caption_image,
        caption_split,
        family_size=config.near_misses + 1,
    )
    if not judgement.true_of_own_image.all():
        bad = captions[int(np.argmin(judgement.true_of_own_image))]
        raise RuntimeError(f"internal error: caption {bad['text']!r} is not true of its own image {bad['image_id']}")
    density = density_statistics(judgement, caption_split, caption_kind, caption_image, split_counts(image_split))

    return WorldContent(
        config=config,
        files=files,
        scenes=scenes,
        image_split=image_split,
        captions=captions,
        caption_kind=caption_kind,
        distinct_forms=int(len(keys)),
        judgement=judgement,
        density=density,
        duplicate_captions=duplicate_captions(captions),
        questions=questions,
        statements=statements,
    )


def split_counts(image_split: np.ndarray) -> dict[str, int]:
    """Images per split, counted from the assignment (families make them differ slightly from the fractions)."""
    return {split: int((image_split == code).sum()) for code, split in enumerate(SPLITS)}


def duplicate_captions(captions: list[dict]) -> dict:
    """How many captions repeat an earlier caption of the same image, word for word (``same_text``)
    or in meaning (``same_logical_form``, paraphrases included), and on how many images.

    Sampling keeps an image's logical forms distinct while it can, but a scene with few objects
    has few true forms of some kinds (a one-object scene has one full description), so a mix
    that asks for more captions than the scene has forms repeats some. Such pairs are the same
    positive twice in the pretraining file, and each other's false negative.
    """
    seen_text, seen_form, images = set(), set(), set()
    same_text = same_form = 0
    for c in captions:
        text, form = (c["image_id"], c["text"]), (c["image_id"], c["key"])
        if form in seen_form:
            same_form += 1
            images.add(c["image_id"])
            same_text += text in seen_text
        seen_text.add(text)
        seen_form.add(form)
    return {"same_text": same_text, "same_logical_form": same_form, "images": len(images)}


def extra_scenes(config: ShapesConfig, count: int, seed: int) -> tuple[SceneArrays, np.ndarray]:
    """``count`` scenes drawn afresh from ``config``'s scene distribution (objects per scene, vocabulary; each
    drawn on its own, no near misses) and rendered in memory at ``config.size``: ``(scenes, uint8 [count, size,
    size, 3])``. None of them is in the world: they are the unimodal image encoder's ImageNet, far more images
    than the paired data, as ImageNet is to COCO. ``seed`` picks the draw (streams apart from the world's)."""
    arrays = [np.empty((count, len(POSITIONS)), dtype=np.int8) for _ in range(3)]
    pixels = np.empty((count, config.size, config.size, 3), dtype=np.uint8)
    for i in track(range(count), "drawing extra scenes"):
        drawn = sample_scene(
            stream_random(config.seed, STREAM_EXTRA_SCENES, seed, i),
            min_objects=config.min_objects,
            max_objects=config.max_objects,
            num_shapes=config.num_shapes,
            num_colors=config.num_colors,
        )
        for arr, row in zip(arrays, drawn):
            arr[i] = row
        pixels[i] = np.asarray(
            render_scene(
                *drawn,
                stream_generator(config.seed, STREAM_EXTRA_PIXELS, seed, i),
                image_size=config.size,
                background_noise=config.background_noise,
            )
        )
    return SceneArrays(*arrays), pixels
