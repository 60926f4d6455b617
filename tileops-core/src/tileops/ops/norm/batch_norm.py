"""BatchNorm forward, matching `torch.nn.functional.batch_norm`, running-stat update included.

The op picks the interface by semantics, from `training`: `batch_norm_fwd_train` normalizes with
the batch's statistics and updates the running ones in place; `batch_norm_fwd_infer`
normalizes with the running statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from ...backward import BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...errors import KernelDeclarationError, OpConfigError, OpInputError
from ...kernel import Kernel, KernelInterface
from ...op import Op
from ...signature import BATCH, HALF_DTYPES, WIDENED, BoundCall, Input, Output, Signature
from ...table import remember
from .._common import (
    ReferenceKernel,
    bool_param,
    contiguous,
    describe,
    eps_param,
    fits,
    float32,
    fraction_param,
    like,
    param_dtype,
    positive_int_param,
    sample_case,
    upcasts,
)

if TYPE_CHECKING:
    from ...samples import Case

Tensor = torch.Tensor
STATS = ("running_mean", "running_var")
_cudnn_enabled = torch._C._get_cudnn_enabled
PER_CHANNEL = ("weight", "bias", *STATS)


class BatchNormCall(CallSpec):
    """One BatchNorm call on a (batch, channels, spatial) view of x, or with `channels_last`
    on a (batch, spatial, channels) one."""

    batch: int
    channels: int
    spatial: int
    eps: float
    momentum: float
    dtype: torch.dtype
    has_weight: bool
    has_bias: bool
    has_running_stats: bool
    param_dtype: torch.dtype | None = None
    """The dtype of the per-channel tensors given (x's, or float32 under mixed precision); None
    when none is given."""
    channels_last: bool = False
    """x is channels_last (4-d) or channels_last_3d (5-d): the kernel gets it as it lies in
    memory, (batch, spatial, channels), and returns that layout; the output keeps x's format,
    as F.batch_norm's does."""


class _BatchNormContract(KernelInterface):
    """The call contract both BatchNorm interfaces share; not an interface of its own.

    Layout contract: `x` is a contiguous (batch, channels, spatial) tensor (the op folded the
    trailing spatial dims into one; batch * spatial >= 1), or, when the call says
    `channels_last`, a contiguous (batch, spatial, channels) one; `weight`, `bias`,
    `running_mean` and `running_var` are contiguous (channels,) tensors or None, all of one
    dtype, the call's `param_dtype`: x's, or float32 beside a 16-bit x (mixed precision, as
    under autocast: statistics in float32, running stats kept and updated in float32). Return
    a contiguous tensor of x's shape and dtype; the op restores the caller's shape and memory
    format. Calls with batch * spatial == 0 never reach a kernel.

    `channels_last`: True when the kernel serves channels_last calls (x as (batch, spatial,
    channels)). Kernels that do not declare it refuse them, whatever their own `refusal` says:
    a kernel written for (batch, channels, spatial) never reads the other layout as its own.
    """

    call_spec = BatchNormCall
    channels_last: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.channels_last, bool):
            raise KernelDeclarationError(
                f"kernel class {cls.__qualname__!r}: channels_last must be True or False, got "
                f"{cls.channels_last!r}"
            )
        if issubclass(cls, Kernel) and not getattr(cls.refusal, "checks_layout", False):
            cls.refusal = _refusing_channels_last(cls.refusal.__func__)

    def forward(
        self,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
    ) -> Tensor:
        raise NotImplementedError


class BatchNormTrainInterface(_BatchNormContract):
    """Interface "batch_norm_fwd_train": normalize with the batch statistics per channel.

    `y = (x - mean) / sqrt(var + eps) * weight + bias`, mean and biased var over batch and
    spatial. When running stats are given (both or neither; then batch * spatial >= 2), update
    them in place: `stat = (1 - momentum) * stat + momentum * batch_stat`, with the unbiased
    var. They are the caller's own tensors: write into them, do not replace them.

    A kernel may return `(y, mean, invstd)`: the batch mean and `1 / sqrt(var + eps)` per
    channel, contiguous float32 (channels,) tensors, which the backward then reads instead of
    passing over x again (the op's `keeps_state`).

    Layout contract: that of every BatchNorm interface, x as contiguous (batch, channels,
    spatial), per-channel tensors as contiguous (channels,) of `param_dtype` (x's, or float32
    beside 16-bit x), running stats updated in that dtype; see `_BatchNormContract`.
    """


class BatchNormInferInterface(_BatchNormContract):
    """Interface "batch_norm_fwd_infer": normalize with the running statistics.

    `y = (x - running_mean) / sqrt(running_var + eps) * weight + bias` per channel; the
    running stats are always given, and only read. `momentum` in the call is unused.

    Layout contract: that of every BatchNorm interface, x as contiguous (batch, channels,
    spatial), per-channel tensors as contiguous (channels,) of `param_dtype` (x's, or float32
    beside 16-bit x); see `_BatchNormContract`.
    """


NOT_CHANNELS_LAST = (
    "x is channels_last, read as (batch, spatial, channels), and the kernel does not declare "
    "channels_last = True"
)


def _refusing_channels_last(own: Callable[..., str | None]) -> classmethod:
    """`own` refusal, after refusing channels_last calls where the kernel does not serve them."""

    def refusal(cls: type, call: BatchNormCall) -> str | None:
        if call.channels_last and not cls.channels_last:
            return NOT_CHANNELS_LAST
        return own(cls, call)

    refusal.checks_layout = True
    return classmethod(refusal)


def _memory_format(x: Tensor) -> torch.memory_format:
    """channels_last (4-d) or channels_last_3d (5-d) when x lies so and is not also plain
    contiguous, as F.batch_norm keeps it; else the contiguous format."""
    layout = _CHANNELS_LAST.get(x.dim())
    if layout is not None and not x.is_contiguous() and x.is_contiguous(memory_format=layout):
        return layout
    return torch.contiguous_format


_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _channels_first(x: Tensor, channels_last: bool) -> Tensor:
    """A kernel's (batch, spatial, channels) x as the (batch, channels, spatial, 1)
    channels_last view F.batch_norm reads in place; x itself otherwise."""
    return x.transpose(1, 2).unsqueeze(-1) if channels_last else x


def _channels_back(y: Tensor, channels_last: bool) -> Tensor:
    """`_channels_first` undone on F.batch_norm's output (channels_last, as its input)."""
    return y.squeeze(-1).transpose(1, 2).contiguous() if channels_last else y


def _batch_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor | None,
    var: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> Tensor:
    """`F.batch_norm`, 16-bit x normalized in float32 and rounded once.

    Neither torch's all-16-bit path nor its mixed-type one (float32 per-channel tensors) does
    that for rows far from zero, so 16-bit x is normalized as a float32 copy. 16-bit running
    stats are blended in float32 copies and stored back; float32 ones (mixed precision) are
    blended in place, exactly as `F.batch_norm` does.
    """
    if x.dtype not in HALF_DTYPES:
        return F.batch_norm(x, mean, var, weight, bias, training, momentum, eps)
    stats = float32(mean), float32(var)
    y = F.batch_norm(x.float(), *stats, float32(weight), float32(bias), training, momentum, eps)
    if training and mean is not None and var is not None and stats[0] is not mean:
        mean.copy_(stats[0])
        var.copy_(stats[1])
    return y.to(x.dtype)


class BatchNormTrainReference(ReferenceKernel, BatchNormTrainInterface):
    """`F.batch_norm` with the batch statistics; it updates the running stats itself, outside
    autograd. 16-bit x is normalized in float32, rounded once, and 16-bit running stats are
    blended in float32 (see `_batch_norm`). A channels_last x is read where it lies."""

    build_fields = ("eps", "momentum", "channels_last")
    channels_last = True

    def __init__(self, eps: float, momentum: float, channels_last: bool) -> None:
        self.eps, self.momentum, self.last = eps, momentum, channels_last

    def forward(
        self,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
    ) -> Tensor:
        stats, x = (running_mean, running_var), _channels_first(x, self.last)
        y = _batch_norm(x, weight, bias, *stats, True, self.momentum, self.eps)
        return _channels_back(y, self.last)


class BatchNormInferReference(ReferenceKernel, BatchNormInferInterface):
    """`F.batch_norm` with the running stats: 16-bit x is normalized in float32, rounded once,
    whether its per-channel tensors are 16-bit or float32 (mixed precision). A channels_last
    x is read where it lies."""

    build_fields = ("eps", "channels_last")
    channels_last = True

    def __init__(self, eps: float, channels_last: bool) -> None:
        self.eps, self.last = eps, channels_last

    def forward(
        self,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
    ) -> Tensor:
        x, stats = _channels_first(x, self.last), (running_mean, running_var)
        return _channels_back(_batch_norm(x, weight, bias, *stats, False, 0.0, self.eps), self.last)


def _signature(training: bool) -> Signature:
    """x of shape [batch, num_features, ...]; per-channel params of x's dtype, or float32
    beside 16-bit x (autocast keeps them float32); stats written in training, and never
    differentiated (F.batch_norm refuses running stats that require grad)."""
    per_channel, dtypes = ("num_features",), (f"{WIDENED}x",)
    inputs = [Input("x", ("batch", "num_features", BATCH), strides_select=True)]
    inputs += [Input(n, per_channel, dtypes=dtypes, optional=True) for n in ("weight", "bias")]
    inputs += [
        Input(
            n,
            per_channel,
            dtypes=dtypes,
            optional=True,
            written=training,
            contiguous=training,
            differentiable=False,
        )
        for n in STATS
    ]
    params = {"num_features": "int", "eps": "float", "momentum": "float", "training": "bool"}
    return Signature(tuple(inputs), params, (Output("out", like="x"),))


_TRAIN, _INFER = _signature(training=True), _signature(training=False)


class BatchNormFwdOp(Op):
    """`F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)`.

    x is (batch, num_features, *spatial) with any number of spatial dims (none included).
    """

    namespace = "tileops"
    interfaces = {
        "batch_norm_fwd_train": BatchNormTrainInterface,
        "batch_norm_fwd_infer": BatchNormInferInterface,
        "backward": BackwardInterface,
    }
    # Two keys: an entry is built from the call spec alone, which does not say the interface,
    # so one class cannot serve both.
    kernel_types = {
        "reference": BatchNormTrainReference,
        "reference_infer": BatchNormInferReference,
        "reference_backward": RecomputeBackward,
    }
    signature = _TRAIN  # the instance's own follows `training`
    keeps_state = True  # a training kernel may keep the batch's mean and invstd

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        training: bool = True,
        *,
        target: str | None = None,
    ) -> None:
        op = type(self).__name__
        self.num_features = positive_int_param(op, "num_features", num_features)
        self.eps = eps_param(op, eps)
        self.momentum = fraction_param(op, "momentum", momentum)
        self.training = bool_param(op, "training", training)
        if training and self.eps == 0:
            raise OpConfigError(
                f"{op}: parameter 'eps' must be > 0 when training (as F.batch_norm requires), "
                "got 0.0"
            )
        self.signature = _TRAIN if training else _INFER
        self._interface = "batch_norm_fwd_train" if training else "batch_norm_fwd_infer"
        self._calls: dict[tuple, BatchNormCall] = {}
        super().__init__(target=target)

    def check(self, call: BoundCall) -> None:
        x, _, _, mean, var = call.tensors
        op = type(self).__name__
        if mean is None or var is None:
            self._check_missing_stats(op, mean, var)
        _check_one_param_dtype(op, call.tensors)
        if self.training and x.shape[0] * math.prod(x.shape[2:]) == 1:
            raise OpInputError(
                f"{op}(): argument 'x' of shape {list(x.shape)} has one value per channel; "
                "expected more than 1 value per channel when training (as F.batch_norm)"
            )

    def state_problem(self, call: CallSpec, state: list[Any]) -> str | None:
        """A training kernel's kept state: the batch mean and invstd, float32 (channels,)."""
        want = (call.channels,), torch.float32, call.device
        if self.training and len(state) == 2 and all(fits(t, *want) for t in state):
            return None
        return (
            f"it kept ({', '.join(describe(t) for t in state)}), expected (mean, invstd), each a "
            f"contiguous float32 tensor of shape {[call.channels]} on {call.device}, in training"
        )

    def _check_missing_stats(self, op: str, *stats: Tensor | None) -> None:
        missing = [name for name, t in zip(STATS, stats, strict=True) if t is None]
        if not self.training:
            raise OpInputError(
                f"{op}(): argument {missing[0]!r} is required in inference (training=False), "
                "which normalizes with the running statistics; pass running_mean and "
                "running_var, or construct the op with training=True"
            )
        if len(missing) == 1:
            given = next(n for n in STATS if n not in missing)
            raise OpInputError(
                f"{op}(): argument {missing[0]!r} is missing while {given!r} is given; pass "
                "both running stats or neither"
            )

    def forward(
        self,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
    ) -> Tensor:
        batch, channels = x.shape[0], x.shape[1]
        spatial = math.prod(x.shape[2:])
        if batch * spatial == 0:  # nothing to normalize: torch leaves the running stats alone
            return torch.empty_like(x)  # x's strides, as F.batch_norm's empty output
        last = _memory_format(x) is not torch.contiguous_format
        call = self._spec(x, (weight, bias, running_mean, running_var), last)
        if last:  # (batch, *spatial, channels) in memory: a free view
            x3 = x.movedim(1, -1).view(batch, spatial, channels)
        else:
            x3 = x.contiguous().view(batch, channels, spatial)
        stats = contiguous(running_mean), contiguous(running_var)
        args = x3, contiguous(weight), contiguous(bias), *stats
        y = self.call_kernel(self._interface, call, x3.shape, x.dtype, *args)
        if not last:
            return like(y, x)
        with torch._C._AutoDispatchBelowADInplaceOrView():  # no view to autograd (see like())
            return y.view(batch, *x.shape[2:], channels).movedim(-1, 1)

    def _spec(self, x: Tensor, per_channel: tuple[Tensor | None, ...], last: bool) -> BatchNormCall:
        """The call spec of x and its per-channel tensors: a layer's calls repeat, so each is
        built once."""
        dtypes = [t if t is None else t.dtype for t in per_channel]
        key = (x.shape, x.dtype, x.device, last, *dtypes)
        call = self._calls.get(key)
        if call is None:
            call = BatchNormCall(
                device=x.device,
                batch=x.shape[0],
                channels=x.shape[1],
                spatial=math.prod(x.shape[2:]),
                eps=self.eps,
                momentum=self.momentum,
                dtype=x.dtype,
                has_weight=per_channel[0] is not None,
                has_bias=per_channel[1] is not None,
                has_running_stats=per_channel[2] is not None,
                param_dtype=param_dtype(*per_channel),
                channels_last=last,
            )
            remember(self._calls, key, call, 64)  # bounded: a layer fed ever-new shapes
        return call

    def native_lane_for(self, call: BoundCall) -> Callable[..., Tensor] | None:
        """torch.batch_norm under torch's autograd (what `F.batch_norm` records: cuDNN's or
        ATen's node, the running stats updated by it), for x in the memory format of `call`'s
        x, where a `torch_native` kernel (cuDNN) serves that layout."""
        x, *per_channel = call.tensors
        if x.shape[0] * math.prod(x.shape[2:]) == 0:  # no kernel sees it
            return None
        layout = _memory_format(x)
        spec = self._spec(x, tuple(per_channel), layout is not torch.contiguous_format)
        kernel = self._hits.get((self._interface, spec)) or self.kernel_for(self._interface, spec)
        if not getattr(kernel, "torch_native", False):
            return None
        training, momentum, eps = self.training, self.momentum, self.eps

        def lane(x: Tensor, *per_channel: Tensor | None) -> Tensor | None:
            if _memory_format(x) is not layout:  # another spec: its kernel may not be native
                return None
            weight, bias, mean, var = per_channel
            cudnn = _cudnn_enabled()
            return torch.batch_norm(x, weight, bias, mean, var, training, momentum, eps, cudnn)

        return lane

    def outputs_for(self, tensors: tuple[Tensor | None, ...]) -> list[Tensor]:
        """What tracing sees: the output keeps x's channels_last format, as the op's does."""
        x = tensors[0]
        return [torch.empty_like(x, memory_format=_memory_format(x))]

    def reference_forward(
        self,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
    ) -> Tensor:
        stats, training = (running_mean, running_var), self.training
        if upcasts(x):  # as the kernels compute: in float32, rounded once
            return _batch_norm(x, weight, bias, *stats, training, self.momentum, self.eps)
        return F.batch_norm(x, *stats, weight, bias, training, self.momentum, self.eps)

    @classmethod
    def native_function(
        cls,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        num_features: int,
        eps: float,
        momentum: float,
        training: bool,
    ) -> Tensor:
        stats = running_mean, running_var
        return F.batch_norm(x, *stats, weight, bias, training, momentum, eps)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        stats = {"num_features": 16}
        shapes = (8, 16, 12), (16,), (16,), (16,), (16,)
        yield sample_case(stats, *shapes, note="training")
        yield sample_case(stats, (8, 16), None, None, None, None, note="training, no stats")
        yield _positive_var(sample_case({**stats, "training": False}, *shapes, note="inference"))


def _check_one_param_dtype(op: str, tensors: tuple[Tensor | None, ...]) -> None:
    """F.batch_norm takes per-channel tensors all of x's dtype or all float32, never a mix."""
    if len({t.dtype for t in tensors[1:] if t is not None}) < 2:
        return
    given = [(n, t.dtype) for n, t in zip(PER_CHANNEL, tensors[1:], strict=True) if t is not None]
    listed = ", ".join(f"{n!r} {str(d).replace('torch.', '')}" for n, d in given)
    raise OpInputError(
        f"{op}(): the per-channel arguments mix dtypes ({listed}); pass them all in x's "
        "dtype or all in float32 (as F.batch_norm requires)"
    )


def _positive_var(case: Case) -> Case:
    """Running variances must be positive for an inference case to mean anything."""
    *rest, var = case.inputs
    return type(case)(case.params, (*rest, var.abs() + 0.5), case.note)
