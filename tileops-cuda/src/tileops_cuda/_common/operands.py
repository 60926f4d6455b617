"""Tensors as the compiled kernels address them, and the stream they are launched on."""

from __future__ import annotations

import torch

ALIGN_BYTES = 16
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU builds


def aligned(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t`, or a copy of it where a view starts off a 16-byte boundary: the kernels read
    16-byte vectors (and TMA needs 16-byte addresses) counted from where a tensor starts, and a
    misaligned vector read faults."""
    if t is None or t.data_ptr() % ALIGN_BYTES == 0:
        return t
    return t.clone()


def all_aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor starts on a 16-byte boundary (`aligned` would copy none)."""
    for t in tensors:
        if t.data_ptr() % ALIGN_BYTES:
            return False
    return True


def as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` as a contiguous (rows, n) tensor: itself when it is one (no view: a view costs the
    host more than the check)."""
    if t.dim() == 2 and t.is_contiguous():
        return t
    return t.contiguous().view(-1, n)


def current_raw_stream(device: torch.device) -> int:
    """The current CUDA stream's handle on `device`, at the least host cost torch offers: what
    scratch buffers reused from call to call are kept per (kernels on one stream run in order,
    two streams' calls could interleave)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index)
    return torch.cuda.current_stream(device).cuda_stream
