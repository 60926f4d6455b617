"""Operands as the kernels address them: 16-byte aligned starts."""

from __future__ import annotations

import torch

from tileops_cuda._common.operands import ALIGN_BYTES, aligned


def test_an_aligned_tensor_passes_through():
    t = torch.randn(8, 64)
    assert aligned(t) is t
    assert aligned(None) is None


def test_a_view_off_a_16_byte_boundary_is_copied_to_an_aligned_start():
    base = torch.randn(8 * 64 + 1)
    view = base[1:].view(8, 64)  # starts 4 bytes past an aligned allocation
    assert view.data_ptr() % ALIGN_BYTES
    copy = aligned(view)
    assert copy.data_ptr() % ALIGN_BYTES == 0
    assert copy.is_contiguous() and torch.equal(copy, view)
