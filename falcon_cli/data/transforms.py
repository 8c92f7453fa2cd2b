"""Image transforms, in one place: ``build_transform(kind, resolution)``.

* ``pretrain``: RandomResizedCrop(res, scale=(0.2, 1.0), bicubic), horizontal flip,
  :class:`AlbefRandAugment` (2 ops, magnitude 7), CLIP mean/std normalisation;
* ``finetune``: the same with scale (0.5, 1.0);
* ``test``: Resize((res, res), bicubic) and normalisation.

About the augmentation: ALBEF's ``RandomAugment(2, 7)`` is an OpenCV re-implementation of
RandAugment restricted to ops that keep colours (Identity, AutoContrast, Equalize,
Brightness, Sharpness, ShearX/Y, TranslateX/Y, Rotate). :class:`AlbefRandAugment` draws
the same ops with the same magnitudes and probabilities, implemented with torchvision on
PIL images. We do not use torchvision's ``RandAugment``: its op list adds Color,
Contrast, Posterize, Solarize (and Invert in some versions), which change colours that
captions name ("a red circle"). Differences from ALBEF that remain: PIL/torchvision
kernels instead of OpenCV (edge pixels differ slightly), and torch's RNG instead of
numpy's (so DataLoader workers get distinct, seedable streams).

Horizontal flips turn "left of" into "right of"; ALBEF flips anyway. Pass ``hflip=False``
for data whose captions name left and right (the shapes world).
"""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from falcon_cli.data.normalization import CLIP_MEAN, CLIP_STD
from falcon_cli.errors import FalconError

TransformKind = Literal["pretrain", "finetune", "test"]
CROP_SCALE = {"pretrain": (0.2, 1.0), "finetune": (0.5, 1.0)}
"""RandomResizedCrop scale range of each training kind."""

_MAX_LEVEL = 10.0
_FILL = [128, 128, 128]
_TRANSLATE_CONST = 10.0


class AlbefRandAugment:
    """ALBEF's ``RandomAugment(N, M)``: N ops drawn with replacement, each applied with probability 0.5.

    At magnitude M (of 10): Brightness/Sharpness factor ``M/10*1.8+0.1``; shear
    ``±M/10*0.3``; translate ``±M`` pixels; rotate ``±M/10*30`` degrees; grey (128) fill.
    Works on PIL images and returns a PIL image.
    """

    OPS = (
        "Identity",
        "AutoContrast",
        "Equalize",
        "Brightness",
        "Sharpness",
        "ShearX",
        "ShearY",
        "TranslateX",
        "TranslateY",
        "Rotate",
    )

    def __init__(self, num_ops: int = 2, magnitude: int = 7, ops: tuple[str, ...] = OPS):
        unknown = [op for op in ops if op not in self.OPS]
        if unknown:
            raise FalconError(f"unknown augmentation op(s) {', '.join(unknown)}; use {', '.join(self.OPS)}")
        self.num_ops = num_ops
        self.magnitude = magnitude
        self.ops = tuple(ops)

    def _signed(self, value: float) -> float:
        return -value if torch.rand(()) < 0.5 else value

    def apply(self, img: Image.Image, op: str) -> Image.Image:
        """Apply one op at this augmenter's magnitude (random sign for geometric ops)."""
        level = self.magnitude / _MAX_LEVEL
        if op == "Identity":
            return img
        if op == "AutoContrast":
            return F.autocontrast(img)
        if op == "Equalize":
            return F.equalize(img)
        if op == "Brightness":
            return F.adjust_brightness(img, level * 1.8 + 0.1)
        if op == "Sharpness":
            return F.adjust_sharpness(img, level * 1.8 + 0.1)
        if op in ("ShearX", "ShearY"):
            shear = math.degrees(math.atan(self._signed(level * 0.3)))
            shear_xy = [shear, 0.0] if op == "ShearX" else [0.0, shear]
            return F.affine(
                img,
                angle=0.0,
                translate=[0, 0],
                scale=1.0,
                shear=shear_xy,
                interpolation=InterpolationMode.BILINEAR,
                fill=_FILL,
                center=[0, 0],
            )
        if op in ("TranslateX", "TranslateY"):
            offset = int(round(self._signed(level * _TRANSLATE_CONST)))
            shift = [offset, 0] if op == "TranslateX" else [0, offset]
            return F.affine(
                img,
                angle=0.0,
                translate=shift,
                scale=1.0,
                shear=[0.0, 0.0],
                interpolation=InterpolationMode.BILINEAR,
                fill=_FILL,
            )
        if op == "Rotate":
            return F.rotate(img, self._signed(level * 30.0), interpolation=InterpolationMode.BILINEAR, fill=_FILL)
        raise ValueError(op)  # unreachable: ops are checked in __init__

    def __call__(self, img: Image.Image) -> Image.Image:
        for i in torch.randint(len(self.ops), (self.num_ops,)).tolist():
            if torch.rand(()) < 0.5:
                img = self.apply(img, self.ops[i])
        return img

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_ops={self.num_ops}, magnitude={self.magnitude})"


def build_transform(
    kind: TransformKind, resolution: int, *, hflip: bool = True
) -> Callable[[Image.Image], torch.Tensor]:
    """The image transform for ``pretrain``, ``finetune`` or ``test`` at ``resolution`` pixels.

    Returns a callable from a PIL RGB image to a float tensor [3, resolution, resolution].
    ``hflip`` only affects the training kinds.
    """
    if not isinstance(resolution, int) or resolution <= 0:
        raise FalconError(f"image resolution must be a positive integer, got {resolution!r}")
    normalize = T.Normalize(CLIP_MEAN, CLIP_STD)
    if kind == "test":
        return T.Compose(
            [
                T.Resize((resolution, resolution), interpolation=InterpolationMode.BICUBIC),
                T.ToTensor(),
                normalize,
            ]
        )
    if kind not in CROP_SCALE:
        raise FalconError(f"unknown transform kind {kind!r}; use pretrain, finetune or test")
    steps: list[Callable] = [
        T.RandomResizedCrop(resolution, scale=CROP_SCALE[kind], interpolation=InterpolationMode.BICUBIC)
    ]
    if hflip:
        steps.append(T.RandomHorizontalFlip())
    steps += [AlbefRandAugment(2, 7), T.ToTensor(), normalize]
    return T.Compose(steps)
