"""Device and mixed precision: bf16 or fp16 autocast on CUDA, bf16 autocast on a CPU with native bf16, else fp32.

``precision`` vocabulary follows open_clip/torchtune: ``fp32``, ``bf16`` (autocast, no
scaler), ``fp16`` (autocast + GradScaler), ``auto`` (bf16 where the GPU supports it, else
fp16 on CUDA, fp32 on CPU: a CPU run is bf16 only when asked, so CPU runs keep their numbers).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Literal

import torch

from falcon_cli.errors import FalconError

Precision = Literal["auto", "fp32", "bf16", "fp16"]


def to_device_async(values: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``values`` on ``device``; a CPU tensor goes to a GPU through pinned memory without waiting for the
    GPU's queue (a pageable copy would wait: a host synchronisation)."""
    if torch.device(device).type == "cuda" and values.device.type == "cpu":
        return values.pin_memory().to(device, non_blocking=True)
    return values.to(device)


def pick_device(requested: str = "auto") -> torch.device:
    """``auto`` → the local CUDA device (LOCAL_RANK) when there is one, else CPU."""
    import os

    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise FalconError(f"device '{requested}' requested but CUDA is not available; use device=cpu or device=auto")
    return device


def resolve_precision(precision: Precision, device: torch.device) -> str:
    """The concrete precision for a device (``auto`` resolved; fp16/bf16 on CPU refused)."""
    if precision == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if precision == "bf16" and device.type == "cpu":
        if not cpu_has_bf16():
            raise FalconError(
                "precision=bf16 on the CPU needs native bf16 matrix units (AVX512-BF16 or AMX, as oneDNN reports: "
                "torch.ops.mkldnn._is_mkldnn_bf16_supported()), which this CPU lacks; use precision=fp32 or auto"
            )
        return precision
    if precision in ("bf16", "fp16") and device.type != "cuda":
        raise FalconError(
            f"precision={precision} needs a CUDA device (this run is on {device}); use precision=fp32 or auto"
        )
    return precision


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX, through oneDNN): only then is bf16
    autocast on the CPU a speed-up rather than an emulation."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN's operators
        return False


def autocast(precision: str, device: torch.device):
    """The autocast context for a resolved precision (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that is enabled only for fp16."""
    return torch.amp.GradScaler(device.type, enabled=(precision == "fp16"))


@contextlib.contextmanager
def fp32_region(device: torch.device) -> Iterator[None]:
    """Disable autocast on ``device`` inside the block (no-op where autocast is unsupported)."""
    try:
        ctx = torch.autocast(device_type=device.type, enabled=False)
    except (RuntimeError, ValueError):  # a device type autocast does not know
        ctx = contextlib.nullcontext()
    with ctx:
        yield
