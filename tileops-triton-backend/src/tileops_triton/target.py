"""Target "triton": Triton kernels for every call of LayerNorm, RMSNorm, softmax and GEMM ops
settled on it (`Op(..., target="triton")` or `set_default_target("triton")`), and BatchNorm and
the attention ops, which Triton has no kernel for, through the op's torch reference: the
detector claims ROCm devices for every op, and a call settled on a target without a builder for
its op raises.

A target sees the op's signature: inputs of any leading shape (contiguous, on the call device),
params by keyword, and output buffers to write. Each builder makes the call spec the op's own
path would make and builds the matching kernel class through its `entry_for`, so the target and
the kernel types share launch plans and tuned configs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from tileops.backend import RMS_NORM_DEFAULT_EPS, TensorSpec
from tileops.errors import OpNotAvailableError
from tileops.ops import (
    BatchNormCall,
    BatchNormFwdOp,
    GemmCall,
    LayerNormCall,
    RMSNormCall,
    SoftmaxCall,
)

from .declare import DEVICES, INTERPRETING, dtype_refusal
from .gemm.kernels import TritonGemm
from .rows.kernels import TritonLayerNorm, TritonRMSNorm, TritonSoftmax

NAME = "triton"


def claims_device(device: torch.device) -> bool:
    """Only ROCm builds of torch, whose "cuda" devices tileops-cuda's kernels cannot run on;
    elsewhere users opt in, and the op's own kernels (Triton's among them) serve by default."""
    return device.type == "cuda" and torch.version.hip is not None


def build_layer_norm(
    x: TensorSpec,
    weight: TensorSpec | None,
    bias: TensorSpec | None,
    *,
    normalized_shape: Sequence[int],
    eps: float,
) -> Callable[..., None]:
    n = _check(x, "LayerNormFwdOp", math.prod(normalized_shape))
    call = LayerNormCall(
        device=x.device, n=n, eps=eps, dtype=x.dtype,
        has_weight=weight is not None, has_bias=bias is not None,
    )  # fmt: skip
    kernel = _built(TritonLayerNorm, call)

    def run(x, weight, bias, *, out, **execution):
        kernel.into(_rows(x, n), _vector(weight, n), _vector(bias, n), _rows(out, n))

    return run


def build_rms_norm(
    x: TensorSpec,
    weight: TensorSpec | None,
    *,
    normalized_shape: Sequence[int],
    eps: float | None,
) -> Callable[..., None]:
    n = _check(x, "RMSNormFwdOp", math.prod(normalized_shape))
    eps = RMS_NORM_DEFAULT_EPS[x.dtype] if eps is None else eps
    call = RMSNormCall(device=x.device, n=n, eps=eps, dtype=x.dtype, has_weight=weight is not None)
    kernel = _built(TritonRMSNorm, call)

    def run(x, weight, *, out, **execution):
        kernel.into(_rows(x, n), _vector(weight, n), _rows(out, n))

    return run


def build_softmax(x: TensorSpec, *, dim: int) -> Callable[..., None]:
    rank = len(x.shape)
    if rank == 0:  # a 0-d x is one element along dim
        _check(x, "SoftmaxFwdOp", 1)
        return _fill_one
    dim %= rank
    n = _check(x, "SoftmaxFwdOp", x.shape[dim])
    kernel = _built(TritonSoftmax, SoftmaxCall(device=x.device, n=n, dtype=x.dtype))

    def run(x, *, out, **execution):
        if dim == rank - 1:
            kernel.into(_rows(x, n), _rows(out, n))
            return
        moved = out.movedim(dim, -1)
        y = torch.empty_like(moved, memory_format=torch.contiguous_format)
        kernel.into(_rows(x.movedim(dim, -1).contiguous(), n), _rows(y, n))
        moved.copy_(y)

    return run


def build_gemm(
    a: TensorSpec, b: TensorSpec, bias: TensorSpec | None, *, trans_a: bool, trans_b: bool
) -> Callable[..., None]:
    """a (m, k) or (k, m) with `trans_a`, b (k, n) or (n, k) with `trans_b`, read as stored."""
    (m, k), n = (a.shape[::-1] if trans_a else a.shape), b.shape[0 if trans_b else 1]
    _check(a, "GemmOp", n)
    call = GemmCall(
        device=a.device, m=m, n=n, k=k, dtype=a.dtype, trans_a=trans_a, trans_b=trans_b,
        has_bias=bias is not None,
    )  # fmt: skip
    kernel = _built(TritonGemm, call)

    def run(a, b, bias, *, out, **execution):
        kernel.into(a, b, bias, out)

    return run


def build_gemm_fwd(a: TensorSpec, b: TensorSpec, *, trans_a: bool, trans_b: bool):
    """`GemmFwdOp` (upstream's name): GemmOp without a bias, so the same kernel."""
    run_with_bias = build_gemm(a, b, None, trans_a=trans_a, trans_b=trans_b)

    def run(a, b, *, out, **execution):
        run_with_bias(a, b, None, out=out)

    return run


def build_batch_norm(
    x: TensorSpec,
    weight: TensorSpec | None,
    bias: TensorSpec | None,
    running_mean: TensorSpec | None,
    running_var: TensorSpec | None,
    *,
    num_features: int,
    eps: float,
    momentum: float,
    training: bool,
) -> Callable[..., None]:
    """The op's own reference kernel of the interface `training` picks, on the op's canonical
    (batch, channels, spatial) layout: so BatchNorm works wherever this target is settled."""
    batch, spatial = x.shape[0], math.prod(x.shape[2:])
    given = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    call = BatchNormCall(
        device=x.device, batch=batch, channels=num_features, spatial=spatial, eps=eps,
        momentum=momentum, dtype=x.dtype, has_weight=weight is not None,
        has_bias=bias is not None, has_running_stats=running_mean is not None,
        param_dtype=given[0].dtype if given else None,
    )  # fmt: skip
    key = "reference" if training else "reference_infer"
    kernel = _built(BatchNormFwdOp.kernel_types[key], call)

    def run(x, weight, bias, running_mean, running_var, *, out, **execution):
        if batch * spatial == 0:  # nothing to normalize: the running stats stay as they are
            return
        x3 = x.view(batch, num_features, spatial)
        out.view(x3.shape).copy_(kernel.forward(x3, weight, bias, running_mean, running_var))

    return run


def _fill_one(x: torch.Tensor, *, out: torch.Tensor, **execution: object) -> None:
    out.fill_(1)


def _check(x: TensorSpec, op: str, n: int) -> int:
    """n, after raising for calls no Triton kernel can serve."""
    reason = dtype_refusal(x.dtype)
    if x.device.type not in DEVICES:
        where = "CUDA devices, or CPU under TRITON_INTERPRET=1"
        reason = f"Triton kernels run on {where}, not {x.device.type!r}"
        if x.device.type == "cpu" and not INTERPRETING:
            reason += " (TRITON_INTERPRET=1 was not set when tileops_triton was imported)"
    if reason:
        raise OpNotAvailableError(f"{op} on target {NAME!r}: {reason}")
    return n


def _built(cls: type, call: object) -> object:
    return cls.entry_for(call)[1]()


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.view(-1, n)


def _vector(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else t.view(n)


def reference_builder(op_cls: type) -> Callable[..., Callable[..., object]]:
    """A builder running `op_cls`'s own torch definition (`reference_forward`) on the call's
    inputs: for the ops Triton has no kernel for (attention), so every op this target's
    detector claims is served. The op's outputs are returned, as the target contract allows."""

    def build(*specs: TensorSpec | None, **params: object) -> Callable[..., object]:
        op = op_cls(**params)

        def run(*inputs: torch.Tensor | None, **outputs: torch.Tensor) -> object:
            result = op.reference_forward(*inputs)
            return tuple(result) if isinstance(result, (tuple, list)) else result

        return run

    return build
