"""tileops.nn modules where models call them as torch.nn's: by torch's keyword, on zero-size
inputs, with Softmax's implicit dim under torch.compile, and inside gradient checkpoints."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import tileops.nn as tnn

KWARGS = {
    nn.RMSNorm: {"normalized_shape": 4},
    nn.LayerNorm: {"normalized_shape": 4},
    nn.Softmax: {"dim": -1},
    nn.BatchNorm1d: {"num_features": 4},
    nn.BatchNorm2d: {"num_features": 4},
    nn.BatchNorm3d: {"num_features": 4},
    nn.Linear: {"in_features": 4, "out_features": 3},
}
SHAPES = {nn.BatchNorm2d: (2, 4, 3, 3), nn.BatchNorm3d: (2, 4, 2, 2, 2)}


def test_every_module_is_covered():
    assert set(KWARGS) == set(tnn.KERNELIZED)


@pytest.mark.parametrize("torch_type", KWARGS, ids=lambda t: t.__name__)
def test_forward_takes_the_input_by_torchs_keyword(torch_type):
    ours_type = tnn.KERNELIZED[torch_type]
    names = [list(inspect.signature(t.forward).parameters) for t in (ours_type, torch_type)]
    assert names[0] == names[1]
    keyword = names[1][1]  # after self: "input", or "x" for nn.RMSNorm
    module = ours_type(**KWARGS[torch_type]).eval()
    x = torch.randn(SHAPES.get(torch_type, (5, 4)))
    torch.testing.assert_close(module(**{keyword: x}), module(x))


# (torch type, constructor kwargs, a zero-size input, train)
ZERO_SIZE = {
    "linear_no_in_features": (nn.Linear, {"in_features": 0, "out_features": 3}, (2, 0), True),
    "linear_no_out_features": (nn.Linear, {"in_features": 3, "out_features": 0}, (2, 3), True),
    "linear_no_rows": (nn.Linear, {"in_features": 3, "out_features": 4}, (0, 3), True),
    "layer_norm_no_rows": (nn.LayerNorm, {"normalized_shape": 4}, (0, 4), True),
    "layer_norm_empty_rows": (nn.LayerNorm, {"normalized_shape": 0}, (2, 0), True),
    "rms_norm_no_rows": (nn.RMSNorm, {"normalized_shape": 4}, (0, 4), True),
    "rms_norm_empty_rows": (nn.RMSNorm, {"normalized_shape": 0}, (2, 0), True),
    "softmax_no_rows": (nn.Softmax, {"dim": -1}, (0, 4), True),
    "softmax_empty_rows": (nn.Softmax, {"dim": -1}, (3, 0), True),
    "batch_norm_no_batch_eval": (nn.BatchNorm1d, {"num_features": 3}, (0, 3), False),
    "batch_norm_no_batch_train": (nn.BatchNorm2d, {"num_features": 3}, (0, 3, 2, 2), True),
    "batch_norm_no_pixels_train": (nn.BatchNorm2d, {"num_features": 3}, (2, 3, 0, 4), True),
}


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
@pytest.mark.parametrize("case", ZERO_SIZE)
def test_zero_size_modules_and_inputs_behave_as_torchs(case):
    torch_type, kwargs, shape, train = ZERO_SIZE[case]
    torch.manual_seed(0)
    theirs = torch_type(**kwargs).train(train)
    ours = tnn.KERNELIZED[torch_type](**kwargs).train(train)
    ours.load_state_dict(theirs.state_dict())
    results = []
    for module in (ours, theirs):
        x = torch.randn(shape, requires_grad=True)
        out = module(x)
        out.sum().backward()
        results.append((out, x.grad, [p.grad for p in module.parameters()]))
    (out, grad, param_grads), (expected, expected_grad, expected_param_grads) = results
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)
    torch.testing.assert_close(param_grads, expected_param_grads)
    torch.testing.assert_close(ours.state_dict(), theirs.state_dict())


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_softmax_with_the_implicit_dim_compiles_fullgraph(rank):
    x = torch.randn((2, 3, 4, 5)[:rank])
    compiled = torch.compile(tnn.Softmax(), fullgraph=True)
    with pytest.warns(UserWarning, match="Implicit dimension choice"):  # torch's, eagerly
        expected = nn.Softmax()(x)
    torch.testing.assert_close(compiled(x), expected)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(
            nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 8), nn.RMSNorm(8), nn.Softmax(-1)
        )

    def forward(self, x: torch.Tensor, reentrant: bool | None) -> torch.Tensor:
        if reentrant is None:
            return self.inner(x)
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=reentrant)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_gradient_checkpointing_recomputes_through_the_modules(reentrant):
    reference = Block()
    model = copy.deepcopy(reference)
    assert len(tnn.kernelize(model).swapped) == 5
    grads = []
    for module, mode in ((model, reentrant), (reference, None)):
        x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
        weights = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
        (module(x, mode) * weights).sum().backward()
        grads.append([x.grad, *(p.grad for p in module.parameters())])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want)
