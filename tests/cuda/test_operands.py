"""Operands as the kernels address them: 16-byte aligned starts."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tileops_cuda._common.operands import ALIGN_BYTES, aligned
from tileops_cuda.rows.kernels import RMSNormBlockRow


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


def test_a_row_kernel_launches_on_aligned_operands_only():
    """rows_out hands the launch x and the params as they are where all start aligned, and
    copies the one that does not; y is allocated like x, after them."""
    kernel = object.__new__(RMSNormBlockRow)
    kernel.plan = SimpleNamespace(global_partials=False)  # no cluster workspace
    launched = []
    kernel.launch = SimpleNamespace(entry=lambda *buffers: launched.append(buffers))
    x, weight = torch.randn(8, 64), torch.randn(64)
    y = kernel.rows_out(x, weight)
    ((x_given, w_given, y_given),) = launched
    assert x_given is x and w_given is weight and y_given is y and y.shape == x.shape

    shifted = torch.randn(64 + 1)[1:]  # 4 bytes past an aligned allocation
    kernel.rows_out(x, shifted)
    x_given, w_given, _ = launched[1]
    assert x_given is x and w_given is not shifted and w_given.data_ptr() % ALIGN_BYTES == 0
    assert torch.equal(w_given, shifted)
