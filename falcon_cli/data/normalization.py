"""The per-channel image statistics every falcon transform normalises with (CLIP's, as ALBEF), in a module of
their own so that model configs can name them without importing torchvision."""

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
"""Per-channel mean ALBEF normalises with (CLIP's)."""
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
"""Per-channel standard deviation ALBEF normalises with (CLIP's)."""

__all__ = ["CLIP_MEAN", "CLIP_STD"]
