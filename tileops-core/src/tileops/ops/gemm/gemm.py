"""GEMM, matching `op(a) @ op(b) (+ bias)` for 2-D a and b, each operand stored as it is given
or transposed (cuBLAS's and upstream TileOPs' `trans_a` / `trans_b` layouts)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ... import library
from ...backward import BackwardCall, BackwardInterface, Tensors
from ...callspec import CallSpec
from ...errors import OpInputError
from ...kernel import Build, Kernel, KernelInterface
from ...op import Op
from ...registry import REGISTRY
from ...signature import BoundCall, Input, Output, Signature, tensor_facts
from ...table import remember
from .._common import ReferenceKernel, bool_param, sample_case

if TYPE_CHECKING:
    from ...samples import Case

NATIVE_LINEAR_LAYOUTS = 256
"""Input layouts `GemmOp.linear` remembers as served by F.linear (an engine's batch sizes vary)."""
_is_grad_enabled = torch.is_grad_enabled
_is_any_autocast_enabled = torch._C._is_any_autocast_enabled

LAYOUTS = {(False, False): "NN", (False, True): "NT", (True, False): "TN", (True, True): "TT"}
"""(trans_a, trans_b) -> the layout's name, as cuBLAS and DeepGEMM spell it."""


class GemmCall(CallSpec):
    """One GEMM call: op(a) (m, k) @ op(b) (k, n), plus a bias of n when `has_bias`.

    `trans_a`: a is stored (k, m), `trans_b`: b is stored (n, k) (`x @ W^T` with torch's
    (out, in) weight is trans_b). The layout the kernel reads, not only the op's flags: an
    operand passed as a transposed view of a contiguous tensor flips its flag (see GemmOp).
    """

    m: int
    n: int
    k: int
    dtype: torch.dtype
    trans_a: bool = False
    trans_b: bool = False
    has_bias: bool = False

    @property
    def layout(self) -> str:
        return LAYOUTS[self.trans_a, self.trans_b]


class GemmInterface(KernelInterface):
    """Interface "gemm": `op(a) @ op(b) + bias`.

    Layout contract: `a` is a contiguous tensor of shape (k, m) if `call.trans_a` else (m, k),
    `b` of shape (n, k) if `call.trans_b` else (k, n), both of the call's dtype; `bias` is None,
    or (`call.has_bias`) a contiguous (n,) tensor of that dtype. Return a contiguous (m, n)
    tensor of that dtype: the products accumulated in at least float32, the bias added before
    the one rounding (as `F.linear` and cuBLAS's bias epilogue). Calls with m == 0 or n == 0
    never reach a kernel; k == 0 does (the result is the bias, or zeros).
    """

    call_spec = GemmCall

    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


class GemmReference(ReferenceKernel, GemmInterface):
    """`torch.mm` / `torch.addmm` on the operands' transposed views (no copy): 16-bit operands
    are accumulated in float32, the bias added and the sum rounded once."""

    build_fields = ("trans_a", "trans_b")
    torch_native = True

    def __init__(self, trans_a: bool, trans_b: bool) -> None:
        self.trans_a, self.trans_b = trans_a, trans_b

    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return _product(a.t() if self.trans_a else a, b.t() if self.trans_b else b, bias)


def _product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)


# -- backward: dA and dB through GemmOp in the transposed layouts ----------------------------

GRADIENT_GEMMS: dict[tuple[bool, bool], tuple[tuple[bool, bool, str, str], ...]] = {
    (False, False): ((False, True, "dy", "b"), (True, False, "a", "dy")),
    (False, True): ((False, False, "dy", "b"), (True, False, "dy", "a")),
    (True, False): ((False, True, "b", "dy"), (False, False, "a", "dy")),
    (True, True): ((True, True, "b", "dy"), (True, True, "dy", "a")),
}
"""(trans_a, trans_b) -> the GEMMs giving (dA, dB): each (trans_a, trans_b, first, second) of a
GemmOp on the stored tensors named. For y = op_a(a) @ op_b(b), d op_a(a) = dy @ op_b(b)^T and
d op_b(b) = op_a(a)^T @ dy; reading each operand transposed where it lies makes every product
come out in its input's stored shape, so nothing is copied or transposed."""


def gemm_gradient_calls(call: GemmCall) -> tuple[GemmCall, GemmCall]:
    """The calls of dA's and dB's GEMMs for a forward `call` whose operands lie in the op's
    layout (and a contiguous dy): dA comes out in a's stored shape over n, dB in b's over m."""
    a_shape = (call.k, call.m) if call.trans_a else (call.m, call.k)
    b_shape = (call.n, call.k) if call.trans_b else (call.k, call.n)
    plans = GRADIENT_GEMMS[call.trans_a, call.trans_b]
    sizes = ((*a_shape, call.n), (*b_shape, call.m))  # (rows, cols, inner) of dA and dB
    grad_a, grad_b = (
        GemmCall(device=call.device, m=m, n=n, k=k, dtype=call.dtype, trans_a=ta, trans_b=tb)
        for (ta, tb, _, _), (m, n, k) in zip(plans, sizes, strict=True)
    )
    return grad_a, grad_b


class GemmBackward(Kernel, BackwardInterface):
    """GemmOp's gradients without recomputing the forward: dA and dB as GemmOps in the
    transposed layouts (`GRADIENT_GEMMS`), each selecting its own kernel by its own shape, and
    dbias as dy summed over rows (float32 accumulation, one rounding). Gradients not needed
    are not computed.

    The op's reference backward (general: a backend's backward kernel wins over it). Traced
    (AOTAutograd, symbolic shapes), each GEMM is one node of GemmOp's operator; eagerly it
    dispatches by shape; under create_graph its own autograd differentiates it, so
    the gradients are differentiable and second-order terms flow through the same GEMMs."""

    devices = frozenset({"cpu", "meta", "cuda"})
    general = True
    differentiable = True

    @classmethod
    def entry_for(cls, call: BackwardCall) -> tuple[Hashable, Build]:
        # the ops it builds select under the registrations of now: a generation's own entry
        identity = (call.params, call.needs, REGISTRY.generation)
        return identity, lambda: cls(dict(call.params), call.needs)

    def __init__(self, params: dict[str, Any], needs: tuple[bool, ...]) -> None:
        plans = GRADIENT_GEMMS[bool(params["trans_a"]), bool(params["trans_b"])]
        self.products = tuple(
            (GemmOp(ta, tb), first, second) if need else None
            for (ta, tb, first, second), need in zip(plans, needs, strict=False)
        )
        self.bias = needs[2:]  # GemmFwdOp has no bias input

    def forward(self, grads: Tensors, inputs: Tensors) -> Tensors:
        a, b = inputs[:2]
        operands = {"a": a, "b": b, "dy": grads[0]}
        found = tuple(
            None
            if plan is None
            else library.call_traced_or_eager(plan[0], (operands[plan[1]], operands[plan[2]], None))
            for plan in self.products
        )
        return (*found, *(grads[0].sum(0) if need else None for need in self.bias))


def _gemm_call(
    a: torch.Tensor, b: torch.Tensor, has_bias: bool, trans_a: bool, trans_b: bool
) -> GemmCall:
    """The call spec of contiguous operands in the layouts (trans_a, trans_b)."""
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    return GemmCall(
        device=a.device, m=m, n=n, k=k, dtype=a.dtype, trans_a=trans_a, trans_b=trans_b,
        has_bias=has_bias,
    )  # fmt: skip


def _signature(trans_a: bool, trans_b: bool, bias: bool = True) -> Signature:
    """a (m, k) or, transposed, (k, m); b (k, n) or (n, k); bias (n,); all of a's dtype."""
    optional = (Input("bias", ("n",), dtypes=("a",), optional=True),) if bias else ()
    return Signature(
        (
            Input("a", ("k", "m") if trans_a else ("m", "k")),
            Input("b", ("n", "k") if trans_b else ("k", "n"), dtypes=("a",)),
            *optional,
        ),
        {"trans_a": "bool", "trans_b": "bool"},
        (Output("out", shape=("m", "n"), dtype_of="a"),),
    )


_SIGNATURES = {layout: _signature(*layout) for layout in LAYOUTS}
_FWD_SIGNATURES = {layout: _signature(*layout, bias=False) for layout in LAYOUTS}


class GemmOp(Op):
    """`op(a) @ op(b) + bias` for 2-D a and b of one dtype, op(t) = t^T where the constructor's
    `trans_a` / `trans_b` say (upstream TileOPs' `GemmFwdOp` arguments, cuBLAS's layouts; the
    default here is NN, `a @ b`). `bias`, optional, is a (n,) tensor added before rounding, as
    `F.linear` adds it: `GemmOp(trans_b=True)(x, W, bias) == F.linear(x, W, bias)`.

    Operands are read where they lie: a contiguous operand in its declared layout, and one
    given as a transposed view of a contiguous tensor (`W.t()`) in the other layout, without a
    copy; any other strides are copied once.
    """

    namespace = "tileops"
    interfaces = {"gemm": GemmInterface, "backward": BackwardInterface}
    kernel_types = {"reference": GemmReference, "reference_backward": GemmBackward}
    signature = _SIGNATURES[False, False]  # the instance's own follows its layout
    _signatures = _SIGNATURES

    def __init__(
        self, trans_a: bool = False, trans_b: bool = False, *, target: str | None = None
    ) -> None:
        op = type(self).__name__
        self.trans_a = bool_param(op, "trans_a", trans_a)
        self.trans_b = bool_param(op, "trans_b", trans_b)
        self.signature = self._signatures[self.trans_a, self.trans_b]
        super().__init__(target=target)

    def forward(
        self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        trans_a, trans_b = self.trans_a, self.trans_b
        if not (a.is_contiguous() and b.is_contiguous()):  # the common case skips the calls
            a, trans_a = _stored(a, trans_a)
            b, trans_b = _stored(b, trans_b)
        if bias is not None:
            bias = bias.contiguous()
        call = _gemm_call(a, b, bias is not None, trans_a, trans_b)
        return self.call_kernel("gemm", call, (call.m, call.n), a.dtype, a, b, bias)

    def lane_for(self, call: BoundCall) -> Callable[..., torch.Tensor] | None:
        """Contiguous operands in the declared layout, as `forward` hands them over; calls
        with other strides take `forward`."""
        kernel, forward = self._served(call), self.forward
        if kernel is None:
            return None

        def lane(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
            if not (a.is_contiguous() and b.is_contiguous()):
                return forward(a, b, bias)
            return kernel(a, b, None if bias is None else bias.contiguous())

        return lane

    def native_lane_for(self, call: BoundCall) -> Callable[..., torch.Tensor] | None:
        """torch.mm / torch.addmm under torch's autograd (what `F.linear` records), for
        contiguous operands served by a `torch_native` kernel (cuBLAS)."""
        if not getattr(self._served(call, select=True), "torch_native", False):
            return None
        product = F.linear if self.trans_b and not self.trans_a else self.reference_forward

        def lane(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> Any:
            return product(a, b, bias) if a.is_contiguous() and b.is_contiguous() else None

        return lane

    def _served(self, call: BoundCall, select: bool = False) -> Callable[..., torch.Tensor] | None:
        """The entry serving `call`'s contiguous operands: from the hit cache, or with `select`
        selected now; None for other operands and for calls no kernel sees (m or n 0)."""
        a, b, *rest = call.tensors
        if not (a.is_contiguous() and b.is_contiguous()):
            return None
        spec = _gemm_call(a, b, bool(rest) and rest[0] is not None, self.trans_a, self.trans_b)
        hit = self._hits.get(("gemm", spec))
        if hit is not None or not select:
            return hit
        return self.kernel_for("gemm", spec) if spec.m and spec.n else None

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`F.linear(x, weight, bias)` for x of any leading dims, through this NT op (what
        `tileops.nn.Linear` calls): x's rows flattened, the output in x's leading dims.

        Calls that need no gradient, of an input layout whose rows a `torch_native` kernel
        served (cuBLAS, which computes F.linear's own product), run F.linear itself from the
        layout's second call: no flattening, no dispatch. As lanes, only while the op reads
        its plain hit cache (no pin, record or simulation active)."""
        if self.trans_a or not self.trans_b or not x.dim():
            raise OpInputError(
                f"{type(self).__name__}.linear() computes x @ weight^T: it needs an op built "
                f"with trans_b=True and trans_a=False (this one: trans_a={self.trans_a}, "
                f"trans_b={self.trans_b}) and an x of at least 1 dim (got {x.dim()})"
            )
        key = (
            tensor_facts(x),
            x.is_contiguous(),
            tensor_facts(weight),
            None if bias is None else tensor_facts(bias),
            _is_grad_enabled(),
        )
        native = self.__dict__.get("_native_linear")
        if native is not None and native.get(key) is self._hits and not _is_any_autocast_enabled():
            return F.linear(x, weight, bias)
        out = linear_rows(self, x, weight, *(() if bias is None else (bias,)))
        if key[1] and x.numel() and self._runs_f_linear(x, weight, bias):
            if native is None:
                native = self.__dict__["_native_linear"] = {}
            remember(native, key, self._hits, NATIVE_LINEAR_LAYOUTS)
        return out

    def _runs_f_linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> bool:
        """Whether the call that just ran on contiguous x's rows was F.linear's product, and
        a later one of its layout would be: the op on its own kernels with no checks, outside
        autocast and scopes, needing no gradient, its kernel `torch_native`."""
        if not weight.is_contiguous():
            return False
        if self._checks or type(self._hits) is not dict or not self.runs_builtin(x.device):
            return False
        if _is_any_autocast_enabled() or (
            _is_grad_enabled()
            and (x.requires_grad or weight.requires_grad or getattr(bias, "requires_grad", False))
        ):
            return False
        rows = x.view(-1, weight.shape[1])  # x is contiguous and not empty
        spec = _gemm_call(rows, weight, bias is not None, False, True)
        return getattr(self._hits.get(("gemm", spec)), "torch_native", False)

    def reference_forward(
        self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.native_function(a, b, bias, self.trans_a, self.trans_b)

    @classmethod
    def native_function(
        cls,
        a: torch.Tensor,
        b: torch.Tensor,
        bias: torch.Tensor | None,
        trans_a: bool,
        trans_b: bool,
    ) -> torch.Tensor:
        return _product(a.t() if trans_a else a, b.t() if trans_b else b, bias)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({}, (64, 48), (48, 80))
        yield sample_case({}, (1, 256), (256, 7), note="skinny")
        yield sample_case({"trans_b": True}, (33, 48), (80, 48), (80,), note="NT, bias")
        yield sample_case({"trans_a": True}, (48, 64), (48, 80), note="TN")
        yield sample_case({"trans_a": True, "trans_b": True}, (48, 5), (7, 48), (7,), note="TT")


class GemmFwdOp(GemmOp):
    """Upstream TileOPs' GEMM op, `op(a) @ op(b)`: GemmOp without a bias, NT by default
    (`trans_b=True`: b is stored (n, k), as a Linear weight), so code and backends written for
    upstream's `GemmFwdOp` run unchanged. Its kernels are GemmOp's: a kernel registered for
    either op serves both (`kernels_of`); a target builds it on its own (its builder is
    called with a and b, and trans_a, trans_b)."""

    namespace = "tileops"
    kernels_of = GemmOp
    signature = _FWD_SIGNATURES[False, True]
    _signatures = _FWD_SIGNATURES

    def __init__(
        self, trans_a: bool = False, trans_b: bool = True, *, target: str | None = None
    ) -> None:
        super().__init__(trans_a, trans_b, target=target)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return super().forward(a, b, None)

    def reference_forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return super().reference_forward(a, b, None)

    @classmethod
    def native_function(
        cls, a: torch.Tensor, b: torch.Tensor, trans_a: bool, trans_b: bool
    ) -> torch.Tensor:
        return GemmOp.native_function(a, b, None, trans_a, trans_b)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({}, (33, 48), (80, 48), note="NT")
        yield sample_case({"trans_b": False}, (1, 256), (256, 7), note="NN, skinny")
        yield sample_case({"trans_a": True}, (48, 64), (80, 48), note="TT")


def linear_rows(
    gemm: Callable[..., torch.Tensor], x: torch.Tensor, weight: torch.Tensor, *bias: Any
) -> torch.Tensor:
    """`F.linear(x, weight, *bias)` by `gemm` (an NT GemmOp, or its operator while compiling)
    on x's rows (a (1, k) row for a 1-D x), viewed back to x's leading dims."""
    rows = x.flatten(0, -2) if x.dim() > 1 else x.unsqueeze(0)  # reshape(-1, k): ambiguous
    return gemm(rows, weight, *bias).view(*x.shape[:-1], weight.shape[0])


def _stored(t: torch.Tensor, trans: bool) -> tuple[torch.Tensor, bool]:
    """`t` as a kernel reads it, and whether it is read transposed: as given when contiguous,
    its transpose in the other layout when that is contiguous (a view, no copy), else a
    contiguous copy in the declared layout."""
    if t.is_contiguous():
        return t, trans
    if t.t().is_contiguous():
        return t.t(), not trans
    return t.contiguous(), trans
