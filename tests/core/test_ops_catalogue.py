"""What every op of the catalogue shares: exports, declarations, sample cases, cheap calls."""

from __future__ import annotations

import inspect

import pytest
import torch
from op_helpers import randn

import tileops
import tileops.ops
from tileops import (
    AttentionBwdOp,
    AttentionDecodeOp,
    AttentionFwdOp,
    AttentionVarlenBwdOp,
    AttentionVarlenFwdOp,
    BatchNormFwdOp,
    CallSpec,
    GemmOp,
    LayerNormFwdOp,
    OpInputError,
    RMSNormFwdOp,
    SoftmaxFwdOp,
)
from tileops.testing import simulate_device

OPS = [LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp, BatchNormFwdOp, GemmOp]
OPS += [AttentionFwdOp, AttentionBwdOp, AttentionDecodeOp, AttentionVarlenFwdOp]
OPS += [AttentionVarlenBwdOp]
LENS, OFFSETS = torch.tensor([2, 3], dtype=torch.int32), torch.tensor([0, 1, 3])
ARGS = {  # a constructor call and a call for each op
    LayerNormFwdOp: ((8,), (randn(2, 8), randn(8), randn(8))),
    RMSNormFwdOp: ((8,), (randn(2, 8), randn(8))),
    SoftmaxFwdOp: ((0,), (randn(4, 3),)),
    BatchNormFwdOp: ((3,), (randn(4, 3), None, None, torch.zeros(3), torch.ones(3))),
    GemmOp: ((), (randn(2, 3), randn(3, 4))),
    AttentionFwdOp: ((True,), (randn(2, 4, 3, 8), randn(2, 2, 3, 8), randn(2, 2, 3, 8))),
    AttentionBwdOp: (
        (),
        (randn(1, 2, 3, 8), randn(1, 2, 3, 8), randn(1, 1, 3, 8), randn(1, 1, 3, 8)),
    ),
    AttentionDecodeOp: ((True,), (randn(2, 2, 1, 8), randn(2, 1, 4, 8), randn(2, 1, 4, 8), LENS)),
    AttentionVarlenFwdOp: ((), (randn(3, 2, 8), randn(3, 1, 8), randn(3, 1, 8), OFFSETS, OFFSETS)),
    AttentionVarlenBwdOp: (
        (),
        (randn(3, 2, 8), randn(3, 2, 8), randn(3, 1, 8), randn(3, 1, 8), OFFSETS, OFFSETS),
    ),
}


@pytest.mark.parametrize("op_cls", OPS, ids=lambda c: c.__name__)
def test_exported_from_tileops_and_tileops_ops(op_cls):
    name = op_cls.__name__
    assert getattr(tileops, name) is op_cls and name in tileops.__all__
    assert getattr(tileops.ops, name) is op_cls and name in tileops.ops.__all__


@pytest.mark.parametrize("op_cls", OPS, ids=lambda c: c.__name__)
def test_interfaces_declare_their_call_spec_and_a_fallback_reference(op_cls):
    for interface in op_cls.interfaces.values():
        assert issubclass(interface.call_spec, CallSpec)
        assert "Layout contract" in interface.__doc__
        assert getattr(tileops.ops, interface.__name__) is interface
        (reference,) = [k for k in op_cls.kernel_types.values() if issubclass(k, interface)]
        assert reference.general and reference.devices == {"cpu", "meta", "cuda"}
    assert "reference" in op_cls.kernel_types


@pytest.mark.parametrize("op_cls", OPS, ids=lambda c: c.__name__)
def test_signature_params_are_the_constructors_and_its_attributes(op_cls):
    params, _ = ARGS[op_cls]
    op = op_cls(*params)
    accepted = [p for p in inspect.signature(op_cls).parameters if p != "target"]
    assert list(op.signature.params) == accepted
    assert op.params() == {name: getattr(op, name) for name in accepted}


def test_calls_read_no_device_facts():
    """Call specs and forward stay on the hot path's budget: no device query, hit or miss."""
    ops = {op_cls: op_cls(*ARGS[op_cls][0]) for op_cls in OPS}
    with simulate_device("cpu", arch=None, sm_count=0) as simulation:
        for op_cls, op in ops.items():
            for _ in range(2):
                op(*ARGS[op_cls][1])
    assert simulation.reads == 0


@pytest.mark.parametrize("op_cls", OPS, ids=lambda c: c.__name__)
def test_sample_cases_run(op_cls):
    cases = list(op_cls.sample_cases())
    assert cases
    for case in cases:
        result = op_cls(**case.params)(*case.inputs)
        for out in result if isinstance(result, tuple) else (result,):  # attention: out, lse
            assert out.dtype == torch.float32 and out.isfinite().all()


NOT_DENSE = {  # a tensor of the same values in another layout; what errors call it and advise
    "sparse_coo": (lambda t: t.to_sparse(), "sparse_coo", r"\.to_dense\(\)"),
    "sparse_csr": (
        lambda t: t.reshape(t.shape[0], -1).to_sparse_csr(),
        "sparse_csr",
        r"\.to_dense\(\)",
    ),
    "nested": (
        lambda t: torch.nested.nested_tensor(list(t.reshape(-1, t.shape[-1]))),
        "nested",
        r"\.to_padded_tensor\(0\.0\)",
    ),
    "jagged": (
        lambda t: torch.nested.nested_tensor(list(t.reshape(-1, t.shape[-1])), layout=torch.jagged),
        "nested",
        r"\.to_padded_tensor\(0\.0\)",
    ),
}
TENSOR_ARGS = [
    (op_cls, position)
    for op_cls in OPS
    for position, t in enumerate(ARGS[op_cls][1])
    if t is not None
]


@pytest.mark.filterwarnings("ignore:.*(sparse|nested|Sparse).*:UserWarning")
@pytest.mark.parametrize("layout", NOT_DENSE)
@pytest.mark.parametrize(
    "op_cls, position", TENSOR_ARGS, ids=[f"{c.__name__}-{p}" for c, p in TENSOR_ARGS]
)
def test_sparse_and_nested_tensors_are_refused_by_name(op_cls, position, layout):
    """Refused on a verdict hit too: a sparse tensor has the shape and dtype of a dense one."""
    params, args = ARGS[op_cls]
    op = op_cls(*params)
    op(*args)  # the dense layout's verdict is remembered
    convert, name, fix = NOT_DENSE[layout]
    bad = list(args)
    bad[position] = convert(args[position])
    argument = op.signature.inputs[position].name
    with pytest.raises(
        OpInputError,
        match=rf"argument '{argument}' is a {name} tensor; tileops ops take dense tensors only "
        rf"\(convert it with {fix}\)",
    ):
        op(*bad)
