"""Ops copy, pickle and save as their constructor arguments and target, and rebuild their
dispatch state (tables, caches, locks) on load: so do models holding them."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from op_helpers import randn
from torch import nn

import tileops
import tileops.nn as tnn
from tileops import Input, Op, Output, Signature

C = 4


def _ops():
    """name: (op, its inputs)."""
    stats = (torch.zeros(C), torch.ones(C))
    return {
        "rms_norm": (tileops.RMSNormFwdOp((2, 8), eps=1e-3), (randn(3, 2, 8), randn(2, 8))),
        "layer_norm": (tileops.LayerNormFwdOp(8), (randn(3, 8), None, randn(8))),
        "softmax": (tileops.SoftmaxFwdOp(dim=0), (randn(3, 8),)),
        "gemm": (tileops.GemmOp(), (randn(3, 8), randn(8, 5))),
        "batch_norm": (
            tileops.BatchNormFwdOp(C, momentum=0.3),
            (randn(2, C, 5), None, None, *stats),
        ),
        "batch_norm_infer": (
            tileops.BatchNormFwdOp(C, training=False),
            (randn(2, C, 5), None, None, *stats),
        ),
    }


def _copies(op):
    buffer = io.BytesIO()
    torch.save(op, buffer)
    buffer.seek(0)
    return {
        "deepcopy": copy.deepcopy(op),
        "pickle": pickle.loads(pickle.dumps(op)),
        "torch.save": torch.load(buffer, weights_only=False),
    }


@pytest.mark.parametrize("called", [False, True], ids=["fresh", "settled"])
@pytest.mark.parametrize("name", list(_ops()))
def test_an_op_copies_pickles_and_saves_as_its_arguments(name, called):
    op, inputs = _ops()[name]
    if called:
        op(*[t if t is None else t.clone() for t in inputs])
    for how, twin in _copies(op).items():
        assert type(twin) is type(op) and twin is not op, how
        assert twin.params() == op.params() and twin.target == op.target, how
        assert twin.settled_target is None, how  # settles anew on its first call
        want = op(*[t if t is None else t.clone() for t in inputs])
        torch.testing.assert_close(twin(*[t if t is None else t.clone() for t in inputs]), want)


def test_a_copy_keeps_the_target_it_was_built_with():
    op = tileops.SoftmaxFwdOp(-1, target="builtin")
    for twin in _copies(op).values():
        assert twin.target == "builtin"


def test_a_pickled_op_holds_no_dispatch_state():
    op, inputs = _ops()["layer_norm"]
    op(*inputs)
    state = pickle.dumps(op)
    for name in ("_table", "_hits", "_settle_lock", "_target_kernels", "KernelTable", "lock"):
        assert name.encode() not in state


def test_loading_an_op_checks_its_arguments_again(monkeypatch):
    """Rebuilt through the constructor: a pickle holding a bad argument fails as the call did."""
    op = tileops.SoftmaxFwdOp(-1)
    op.dim = "last"  # as an old or tampered pickle might hold
    with pytest.raises(tileops.OpConfigError, match="parameter 'dim' must be an int"):
        pickle.loads(pickle.dumps(op))


class Doubled(Op):
    """An op whose signature has untyped params: it pickles its attributes instead."""

    namespace = "tests.pickling"
    signature = Signature((Input("x", ("n",)),), ("scale",), (Output("out", like="x"),))

    def __init__(self, scale: float) -> None:
        self.scale = scale
        super().__init__()

    def forward(self, x):
        return x * 2 * self.scale


def test_an_op_with_untyped_params_pickles_its_attributes_without_dispatch_state():
    op = Doubled(1.5)
    x = randn(6)
    twin = copy.deepcopy(op)
    assert twin.scale == 1.5 and twin.__dict__.keys() == {"scale", "target"}
    torch.testing.assert_close(twin(x), op(x))
    assert twin._table is op._table  # attached on first use: the class's one table


class Holder(nn.Module):
    """A user module holding ops beside tileops.nn modules."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = tnn.Linear(8, 8)
        self.norm = tnn.LayerNorm(8)
        self.bn = tnn.BatchNorm1d(8)
        self.softmax = tileops.SoftmaxFwdOp(-1)
        self.rms = tileops.RMSNormFwdOp(8)

    def forward(self, x):
        y = self.bn(self.norm(self.linear(x)))
        return self.softmax(self.rms(y, None))


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_model_holding_ops_and_modules_copies_and_saves(how):
    torch.manual_seed(0)
    model = Holder()
    x = randn(5, 8)
    model(x)  # settled, with running stats updated once
    twin = _copies(model)[how]
    assert twin.softmax is not model.softmax and twin.linear.weight is not model.linear.weight
    torch.testing.assert_close(twin.state_dict(), model.state_dict())
    torch.testing.assert_close(twin(x), model(x))
    torch.testing.assert_close(twin.bn.running_mean, model.bn.running_mean)
    twin.eval(), model.eval()
    torch.testing.assert_close(twin(x), model(x))
