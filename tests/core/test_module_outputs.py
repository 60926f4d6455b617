"""tileops.nn modules' outputs as torch.nn's: zero-size inputs served, and outputs that are no
views (FSDP2 drops its pre-backward hook on an in-place op on a module's view output)."""

from __future__ import annotations

import copy

import pytest
import torch
from op_helpers import randn
from torch import nn

import tileops.nn as tnn

# name: (torch module factory, input shapes to try)
MODULES = {
    "Linear": (lambda: nn.Linear(8, 6), [(0, 8), (3, 0, 8), (8,)]),
    "Linear_in_0": (lambda: nn.Linear(0, 6), [(4, 0), (2, 3, 0), (0,)]),
    "Linear_out_0": (lambda: nn.Linear(8, 0), [(4, 8)]),
    "LayerNorm": (lambda: nn.LayerNorm(8), [(0, 8), (2, 0, 8)]),
    "RMSNorm": (lambda: nn.RMSNorm(8), [(0, 8), (2, 0, 8)]),
    "Softmax": (lambda: nn.Softmax(dim=1), [(0, 8), (2, 0), (2, 0, 3)]),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(8), [(0, 8), (0, 8, 5), (3, 8, 0)]),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(3).eval(), [(0, 3, 4, 4), (2, 3, 0, 4)]),
}
CASES = [(name, shape) for name, (_, shapes) in MODULES.items() for shape in shapes]


def _pair(name):
    torch.manual_seed(0)
    theirs = MODULES[name][0]()
    ours = copy.deepcopy(theirs)
    assert len(tnn.kernelize(ours).swapped) == 1
    return theirs, ours


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize(("name", "shape"), CASES, ids=[f"{n}-{list(s)}" for n, s in CASES])
def test_zero_size_inputs_give_what_torch_gives(name, shape):
    theirs, ours = _pair(name)
    results = []
    for module in (theirs, ours):
        x = randn(*shape).requires_grad_()
        y = module(x)
        y.sum().backward()
        results.append((y, x.grad))
    (want, want_grad), (got, got_grad) = results
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


OUTPUT_SHAPES = {
    "Linear": [(5, 8)],  # >2-d: a view of the GEMM's rows (see the report of issue 31)
    "LayerNorm": [(5, 8), (2, 3, 8)],
    "RMSNorm": [(5, 8), (2, 3, 8)],
    "Softmax": [(5, 8), (2, 8, 3)],
    "BatchNorm1d": [(5, 8), (2, 8, 3)],
}


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name", list(OUTPUT_SHAPES))
def test_outputs_are_no_views_as_torchs_are_not(name, grad):
    theirs, ours = _pair(name)
    for shape in OUTPUT_SHAPES[name]:
        x = randn(*shape).requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            assert not theirs(x)._is_view()
            assert not ours(x)._is_view()
