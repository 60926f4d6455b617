"""Op signatures and the checks generated from them.

A signature lists an op's tensor inputs (optional or not, allowed dtypes, shape pattern,
whether the op writes them), its params (the constructor's semantic parameters) and its
outputs. From it come the argument parsing and checks that run before any kernel, the output
buffers handed to targets, and the `TensorSpec`s target builders receive.

Shape patterns are tuples of dims: an int is exact; a name binds a size that must agree across
inputs (pre-bound when a param has that name); `"*name"` expands a tuple param; one `"..."`,
anywhere, matches any number of dims (leading batch dims, or BatchNorm's trailing spatial
dims), each input's own: two inputs of `("...", "n")` agree on n only. `Input("r", like="x")`
is "same shape as x", whatever its rank. Dtypes may name another input: `"x"` means "same
dtype as x", `"float32 or x"` also allows float32 parameters beside a 16-bit x (mixed
precision); `same_dtype` groups inputs
that, when given, must share one dtype (LayerNorm's weight and bias: both x's, or both float32).
Inputs are dense (strided) tensors: sparse and nested ones are refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

import torch

from .errors import OpInputError

Dim = int | str
BATCH = "..."
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)
WIDENED = "float32 or "
"""Prefix of a dtype reference to another input: `"float32 or x"` allows x's dtype, and float32
when x is 16-bit (parameters kept in float32 under mixed precision, as torch's norms accept)."""


@dataclass(frozen=True)
class TensorSpec:
    """What a target builder knows of one input: where it lives, its dtype and shape."""

    device: torch.device
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        return cls(tensor.device, tensor.dtype, tuple(tensor.shape))


@dataclass(frozen=True)
class Input:
    """One tensor argument.

    `written`: the op updates it in place (BatchNorm's running stats); such an input must be
    passed by the caller, so with `contiguous` the call is refused when it is not contiguous
    (a copy would lose the update). Inputs that are not written may have any strides.
    `differentiable`: False where the op has no gradient for it (running stats); such an input,
    and every written one, must not require grad under autograd (as torch's ops refuse).
    `strides_select`: the op's kernels are chosen by whether it is contiguous (BatchNorm's
    channels_last x), so contiguous and other calls keep verdicts and lanes of their own.
    """

    name: str
    shape: tuple[Dim, ...] = ()
    dtypes: tuple[torch.dtype | str, ...] = FLOAT_DTYPES
    optional: bool = False
    written: bool = False
    contiguous: bool = False
    device: str | None = None  # "cpu": stays on the host whatever the call device
    differentiable: bool = True
    strides_select: bool = False
    like: str | None = None
    """`like="x"`: same shape as input x, whatever its rank (leave `shape` out)."""

    def __post_init__(self) -> None:
        if self.like is not None:
            if self.shape:
                raise ValueError(
                    f"signature input {self.name!r}: give a shape pattern or like=, not both"
                )
            object.__setattr__(self, "shape", (BATCH,))  # any rank; `like` checks the rest


@dataclass(frozen=True)
class Output:
    """An output: same shape and dtype as input `like`, or `shape` with the dtype of `dtype_of`
    promoted to at least `min_dtype` (attention's log-sum-exp: float32 beside 16-bit inputs).

    `differentiable`: False where the op defines no gradient through it (the log-sum-exp, as
    torch's own attention kernels declare it); under autograd it comes back not requiring grad.
    """

    name: str
    like: str | None = None
    shape: tuple[Dim, ...] = ()
    dtype_of: str | None = None
    min_dtype: torch.dtype | None = None
    differentiable: bool = True

    def dtype_from(self, dtype: torch.dtype) -> torch.dtype:
        """This output's dtype for inputs of `dtype` (that of `like` or `dtype_of`)."""
        return dtype if self.min_dtype is None else torch.promote_types(dtype, self.min_dtype)


tensor_facts = attrgetter("shape", "dtype", "device", "layout", "requires_grad")
"""What a layout key holds of each tensor (read in C by one attrgetter)."""
_new_bound_call = tuple.__new__  # skips the named tuple's Python-level __new__ on the hot path


class BoundCall(NamedTuple):
    """One call after parsing and checking: inputs in signature order, the call device, the
    sizes the shape patterns bound, and whether every tensor the call writes is empty.
    A named tuple: one is made on every op call. `lane`: a two-item list every call of this
    input layout shares, where the op keeps its lanes for them: for plain calls
    (`Op.lane_for`, else `Op.native_lane_for`) and for autograd calls (`Op.native_lane_for`)."""

    tensors: tuple[torch.Tensor | None, ...]
    device: torch.device
    sizes: dict[str, int]
    written_empty: bool
    requires_grad: bool  # some input requires grad (whether grad mode is on is asked apart)
    lane: list


class Signature:
    """`params` names the constructor's semantic parameters; given as a dict of torch.library
    schema types (`{"eps": "float"}`), the op also becomes a torch.library operator."""

    def __init__(
        self,
        inputs: tuple[Input, ...],
        params: tuple[str, ...] | Mapping[str, str],
        outputs: tuple[Output, ...],
        same_dtype: tuple[tuple[str, ...], ...] = (),
    ) -> None:
        self.inputs = inputs
        self.params = tuple(params)
        self.param_types = dict(params) if isinstance(params, Mapping) else None
        self.outputs = outputs
        self.same_dtype = same_dtype
        self.names = tuple(i.name for i in inputs)
        self._positions = {name: k for k, name in enumerate(self.names)}
        # inputs whose contiguity the layout key holds: those that must stay so, and those
        # whose strides select the kernel
        self._keyed_contiguity = tuple(
            (i.written and i.contiguous) or i.strides_select for i in inputs
        )
        self._keyed_at = tuple(k for k, keyed in enumerate(self._keyed_contiguity) if keyed)
        # what autograd needs per call, read once: positions of the inputs the op writes, of
        # those without a gradient (written or not differentiable), of outputs without one
        self.written_at = tuple(k for k, i in enumerate(inputs) if i.written)
        self.gradless_at = tuple(
            k for k, i in enumerate(inputs) if i.written or not i.differentiable
        )
        self.frozen_at = tuple(k for k, o in enumerate(outputs) if not o.differentiable)
        self._validate()

    def _validate(self) -> None:
        """Catch typos in a signature when the op module is imported, not on some later call."""
        for spec in self.inputs:
            refs = [d.removeprefix(WIDENED) for d in spec.dtypes if isinstance(d, str)]
            stars = [d[1:] for d in spec.shape if isinstance(d, str) and d.startswith("*")]
            bad = [r for r in refs if r not in self._positions] + [
                p for p in stars if p not in self.params
            ]
            if bad or spec.shape.count(BATCH) > 1:
                raise ValueError(
                    f"signature input {spec.name!r}: unknown names {bad} or several {BATCH!r}"
                )
        for out in self.outputs:
            ref = out.like if out.like is not None else out.dtype_of
            if ref not in self._positions:
                raise ValueError(f"signature output {out.name!r} refers to unknown input {ref!r}")
        for spec in self.inputs:
            if (
                spec.like is not None
                and self._positions.get(spec.like, len(self.inputs)) >= (self._positions[spec.name])
            ):
                raise ValueError(
                    f"signature input {spec.name!r}: like={spec.like!r} must name an input "
                    "listed before it"
                )
        unknown = [n for group in self.same_dtype for n in group if n not in self._positions]
        if unknown:
            raise ValueError(f"signature same_dtype names unknown inputs {unknown}")

    # -- parsing and checks ------------------------------------------------------------------
    def plan(
        self, params: Mapping[str, Any], check: Callable[[BoundCall], None] | None = None
    ) -> ShapePlan:
        """The shape patterns with one op instance's params filled in: built once per instance,
        so each call only compares sizes. `check`: the op's own checks of the layout, run
        with the signature's, once per layout (`Op.layout_checks`)."""
        sizes = {k: v for k, v in params.items() if isinstance(v, int) and not isinstance(v, bool)}
        patterns = tuple(_Pattern.expand(spec.shape, params) for spec in self.inputs)
        return ShapePlan(sizes, patterns, check)

    def bind(
        self, op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], plan: ShapePlan
    ) -> BoundCall:
        """Parse `op(*args, **kwargs)` and run every check; errors name the argument."""
        values = self.parse(op, args, kwargs)
        return self.bound(op, values, *self.known(values, plan), plan)

    def known(self, values: tuple, plan: ShapePlan) -> tuple[tuple | None, tuple | None]:
        """(the layout key of parsed `values`, the verdict remembered for it or None); the key
        is None where an input is no dense tensor (`bound`'s checks then say which)."""
        try:
            key = self._layout_key(values)
            return key, plan.verdicts.get(key)
        except (AttributeError, RuntimeError):
            return None, None

    def bound(
        self, op: str, values: tuple, key: tuple | None, known: tuple | None, plan: ShapePlan
    ) -> BoundCall:
        """The call of parsed `values`: from the layout's verdict `known`, else checked (and
        the verdict remembered under `key`)."""
        if known is not None:
            return _new_bound_call(BoundCall, (values, *known))
        device = self._check_tensors(op, values)
        self._check_same_dtype(op, values)
        sizes = self._check_shapes(op, values, plan)
        requires_grad = any(v is not None and v.requires_grad for v in values)
        empty = self._all_written_empty(values, sizes)
        verdict = (device, sizes, empty, requires_grad, [None, None])
        call = BoundCall(values, *verdict)
        if plan.check is not None:
            plan.check(call)
        if key is not None:
            plan.remember(key, verdict)
        return call

    def _layout_key(self, values: tuple) -> tuple:
        """What the checks' verdict (and the lanes) depend on (the hot path): per input None,
        or its shape, dtype, device, layout and requires_grad, read in C by one attrgetter; for
        an input written in place or whose strides select the kernel, also whether it is
        contiguous."""
        try:
            facts = tuple([None if v is None else tensor_facts(v) for v in values])
            if not self._keyed_at:
                return facts
            return (*facts, *[values[k].is_contiguous() for k in self._keyed_at])
        except AttributeError:  # not a tensor, or a keyed input left out
            pass
        facts = tensor_facts
        return tuple(
            None if v is None else (*facts(v), v.is_contiguous()) if keyed else facts(v)
            for v, keyed in zip(values, self._keyed_contiguity, strict=True)
        )

    def parse(self, op: str, args: tuple, kwargs: Mapping[str, Any]) -> tuple:
        """The call's inputs in signature order (None for those not passed), unchecked."""
        absent = len(self.inputs) - len(args)
        if not kwargs and absent >= 0:  # inputs by position, trailing optional ones left out
            return (*args, *((None,) * absent)) if absent else args
        if len(args) > len(self.inputs):
            raise OpInputError(
                f"{op}() takes at most {len(self.inputs)} tensor arguments "
                f"({', '.join(self.names)}), got {len(args)}"
            )
        values = list(args) + [None] * (len(self.inputs) - len(args))
        for name, value in kwargs.items():
            position = self._positions.get(name)
            if position is None:
                raise OpInputError(
                    f"{op}() got an unexpected argument {name!r}; it takes {', '.join(self.names)}"
                )
            if position < len(args):
                raise OpInputError(f"{op}() got argument {name!r} twice (by position and by name)")
            values[position] = value
        return tuple(values)

    def _check_tensors(self, op: str, values: tuple) -> torch.device:
        device = None
        for spec, value in zip(self.inputs, values, strict=True):
            if value is None:
                if not spec.optional:
                    raise OpInputError(f"{op}(): argument {spec.name!r} is required")
                continue
            if not isinstance(value, torch.Tensor):
                raise OpInputError(
                    f"{op}(): argument {spec.name!r} must be a torch.Tensor, "
                    f"got {type(value).__name__}"
                )
            if value.layout is not torch.strided or value.is_nested:
                raise _not_dense(op, spec.name, value)
            self._check_dtype(op, spec, value, values)
            if spec.written and spec.contiguous and not value.is_contiguous():
                raise OpInputError(
                    f"{op}(): argument {spec.name!r} is written in place and must be contiguous; "
                    "pass a contiguous tensor (an internal copy would lose the update)"
                )
            if spec.device == "cpu":
                if value.device.type != "cpu":
                    raise OpInputError(
                        f"{op}(): argument {spec.name!r} must stay on the host (cpu), "
                        f"got a tensor on {value.device}"
                    )
            elif device is None:
                device = value.device
            elif value.device != device:
                raise OpInputError(
                    f"{op}(): argument {spec.name!r} is on {value.device}, but "
                    f"{self._first_on_device(values)!r} is on {device}; all tensors must be on "
                    "one device"
                )
        return device if device is not None else torch.device("cpu")

    def _first_on_device(self, values: tuple) -> str:
        return next(
            s.name
            for s, v in zip(self.inputs, values, strict=True)
            if v is not None and s.device != "cpu"
        )

    def _check_dtype(self, op: str, spec: Input, value: torch.Tensor, values: tuple) -> None:
        allowed = []
        for dtype in spec.dtypes:
            if isinstance(dtype, str):
                widened = dtype.startswith(WIDENED)
                other = values[self._positions[dtype.removeprefix(WIDENED)]]
                if other is None:
                    continue
                dtype = other.dtype
                if widened and dtype in HALF_DTYPES and value.dtype == torch.float32:
                    return
            if value.dtype == dtype:
                return
            allowed.append(dtype)
        names = ", ".join(str(d).replace("torch.", "") for d in dict.fromkeys(allowed))
        raise OpInputError(
            f"{op}(): argument {spec.name!r} has dtype {str(value.dtype).replace('torch.', '')}, "
            f"expected {names}"
        )

    def _check_same_dtype(self, op: str, values: tuple) -> None:
        """Inputs of one `same_dtype` group that are given agree on their dtype (a mix would
        leave a kernel reading the call spec's one parameter dtype misreading the others)."""
        for group in self.same_dtype:
            given = [(n, values[self._positions[n]]) for n in group]
            dtypes = [(n, v.dtype) for n, v in given if v is not None]
            for name, dtype in dtypes[1:]:
                first, want = dtypes[0]
                if dtype != want:
                    raise OpInputError(
                        f"{op}(): argument {name!r} has dtype {dtype_name(dtype)}, but {first!r} "
                        f"has dtype {dtype_name(want)}; expected {name!r} in {dtype_name(want)} "
                        f"({', '.join(group)} must share one dtype when given)"
                    )

    def _check_shapes(self, op: str, values: tuple, plan: ShapePlan) -> dict[str, int]:
        sizes = dict(plan.sizes)
        for k, (pattern, value) in enumerate(zip(plan.patterns, values, strict=True)):
            if value is not None and not pattern.match(value.shape, sizes):
                raise self._shape_error(op, k, values, plan)
        for spec, value in zip(self.inputs, values, strict=True):
            if spec.like is not None and value is not None:
                other = values[self._positions[spec.like]]
                if other is not None and value.shape != other.shape:
                    raise OpInputError(
                        f"{op}(): argument {spec.name!r} has shape {list(value.shape)}, expected "
                        f"the shape of {spec.like!r}, {list(other.shape)}"
                    )
        return sizes

    def _shape_error(self, op: str, k: int, values: tuple, plan: ShapePlan) -> OpInputError:
        """The error for input `k`, naming where each size it must have comes from: a param
        or another argument's dim. Replays the earlier inputs (errors only: not per call)."""
        sizes = dict(plan.sizes)
        sources = {name: f"{name}={size}" for name, size in plan.sizes.items()}
        for spec, pattern, value in zip(self.inputs[:k], plan.patterns, values, strict=False):
            if value is not None:
                pattern.bind(value.shape, sizes, sources, f"{spec.name}'s")
        name, shape = self.inputs[k].name, list(values[k].shape)
        return OpInputError(
            f"{op}(): argument {name!r} " + plan.patterns[k].mismatch(shape, sizes, sources)
        )

    # -- outputs -----------------------------------------------------------------------------
    def _output_layout(self, call: BoundCall) -> list[tuple[str, list[int], torch.dtype]]:
        layout = []
        for out in self.outputs:
            if out.like is not None:
                like = call.tensors[self._positions[out.like]]
                layout.append((out.name, list(like.shape), like.dtype))
            else:
                shape = [call.sizes[d] if isinstance(d, str) else d for d in out.shape]
                dtype = call.tensors[self._positions[out.dtype_of]].dtype
                layout.append((out.name, shape, out.dtype_from(dtype)))
        return layout

    def make_outputs(self, call: BoundCall) -> dict[str, torch.Tensor]:
        """Fresh, contiguous output tensors for `call`, keyed by output name."""
        return {
            name: torch.empty(shape, dtype=dtype, device=call.device)
            for name, shape, dtype in self._output_layout(call)
        }

    def outputs_for(self, tensors: tuple) -> list[torch.Tensor]:
        """Outputs for `tensors` without any check: what tracing (fake tensors, symbolic sizes)
        needs to know of a call."""
        sizes = _named_sizes(self.inputs, tensors)
        outputs = []
        for out in self.outputs:
            if out.like is not None:
                like = tensors[self._positions[out.like]]
                outputs.append(torch.empty_like(like, memory_format=torch.contiguous_format))
            else:
                source = tensors[self._positions[out.dtype_of]]
                shape = [sizes[d] if isinstance(d, str) else d for d in out.shape]
                outputs.append(source.new_empty(shape, dtype=out.dtype_from(source.dtype)))
        return outputs

    def _all_written_empty(self, values: tuple, sizes: dict[str, int]) -> bool:
        """True when every output and written input is empty: such a call runs no kernel."""
        written = (v for s, v in zip(self.inputs, values, strict=True) if s.written)
        if any(v is not None and v.numel() for v in written):
            return False
        for out in self.outputs:
            if out.like is not None:
                if values[self._positions[out.like]].numel():
                    return False
            elif all(sizes[d] if isinstance(d, str) else d for d in out.shape):
                return False
        return True


def _not_dense(op: str, name: str, value: torch.Tensor) -> OpInputError:
    if value.is_nested:
        kind, fix = "nested", ".to_padded_tensor(0.0)"
    else:
        kind, fix = str(value.layout).removeprefix("torch."), ".to_dense()"
    return OpInputError(
        f"{op}(): argument {name!r} is a {kind} tensor; tileops ops take dense tensors only "
        f"(convert it with {fix})"
    )


def dtype_name(dtype: torch.dtype) -> str:
    """`bfloat16` for torch.bfloat16: how every message names a dtype."""
    return str(dtype).removeprefix("torch.")


def _named_sizes(inputs: tuple[Input, ...], tensors: tuple) -> dict[str, Any]:
    """The sizes named by plain dims of the inputs' patterns, read off `tensors` by position
    (before a `...` from the front, after it from the back)."""
    sizes: dict[str, Any] = {}
    for spec, t in zip(inputs, tensors, strict=True):
        if t is None:
            continue
        dims = spec.shape
        at = dims.index(BATCH) if BATCH in dims else len(dims)
        head, tail = dims[:at], dims[at + 1 :]
        stars = [k for k, d in enumerate(tail) if isinstance(d, str) and d.startswith("*")]
        tail = tail[stars[-1] + 1 :] if stars else tail  # before a star: position unknown
        indexed = [*enumerate(head), *((d - len(tail), name) for d, name in enumerate(tail))]
        for index, name in indexed:
            if isinstance(name, str) and not name.startswith("*") and name not in sizes:
                sizes[name] = t.shape[index]
    return sizes


@dataclass(frozen=True)
class ShapePlan:
    """One op instance's view of its signature: sizes bound by params, each input's pattern
    with `*param` dims expanded, and the verdicts of the checks for the input layouts seen."""

    sizes: dict[str, int]
    patterns: tuple[_Pattern, ...]
    check: Callable[[BoundCall], None] | None = None
    verdicts: dict[tuple, tuple] = field(default_factory=dict)

    def remember(self, key: tuple, verdict: tuple) -> None:
        if len(self.verdicts) >= 256:  # bounded: an op called with ever-new shapes
            self.verdicts.clear()
        self.verdicts[key] = verdict


@dataclass(frozen=True)
class _Pattern:
    """One input's dims: `head` before a `...`, `tail` after it (all of them when no `...`).

    `origins` holds, for each dim of head + tail, the `param=value` a `*param` dim came from
    (None for the others): shape errors cite it.
    """

    head: tuple[Dim, ...]
    tail: tuple[Dim, ...]
    batch: bool
    origins: tuple[str | None, ...] = ()
    dims: tuple[Dim, ...] = field(init=False, repr=False, compare=False)  # head + tail

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", self.head + self.tail)

    @classmethod
    def expand(cls, shape: tuple[Dim, ...], params: Mapping[str, Any]) -> _Pattern:
        dims: list[Dim] = []
        origins: list[str | None] = []
        for dim in shape:
            if isinstance(dim, str) and dim.startswith("*"):
                value = params[dim[1:]]
                dims.extend(value)
                origins.extend([f"{dim[1:]}={tuple(value)!r}"] * len(value))
            else:
                dims.append(dim)
                origins += [] if dim == BATCH else [None]
        if BATCH not in dims:
            return cls((), tuple(dims), False, tuple(origins))
        at = dims.index(BATCH)
        return cls(tuple(dims[:at]), tuple(dims[at + 1 :]), True, tuple(origins))

    def match(self, shape: tuple[int, ...], sizes: dict[str, int]) -> bool:
        """Whether `shape` fits, binding the names not bound yet (hot on a verdict miss: a
        decode step's new key length)."""
        dims = self.dims
        if len(shape) != len(dims):
            if not (self.batch and len(shape) > len(dims)):
                return False
            shape = shape[: len(self.head)] + shape[len(shape) - len(self.tail) :]
        bind = sizes.setdefault
        for dim, size in zip(dims, shape, strict=True):
            if size != (dim if isinstance(dim, int) else bind(dim, size)):
                return False
        return True

    def _positions(self, rank: int) -> list[tuple[Dim, int, str | None]]:
        """Each dim of head + tail with its index in a shape of `rank` dims, and its origin."""
        at = [*range(len(self.head)), *range(rank - len(self.tail), rank)]
        return list(zip(self.head + self.tail, at, self.origins, strict=True))

    def bind(
        self, shape: tuple[int, ...], sizes: dict[str, int], sources: dict[str, str], owner: str
    ) -> None:
        """Bind the names a matching `shape` of argument `owner` binds first, with sources."""
        for dim, at, _ in self._positions(len(shape)):
            if isinstance(dim, str) and dim not in sizes:
                sizes[dim], sources[dim] = shape[at], f"{owner} dim {at}"

    def mismatch(self, shape: list[int], sizes: dict[str, int], sources: dict[str, str]) -> str:
        """Why `shape` does not fit, given the sizes bound before (and where they come from)."""
        fixed = len(self.head) + len(self.tail)
        if len(shape) != fixed and not (self.batch and len(shape) > fixed):
            need = f"at least {fixed}" if self.batch else f"{fixed}"
            cited = "".join(f" from {o}" for o in dict.fromkeys(self.origins) if o)
            return f"must have {need} dimensions ({self}{cited}), got shape {shape}"
        expected = f"has shape {shape}, expected {self.render(sizes)}"
        for dim, at, origin in self._positions(len(shape)):
            if isinstance(dim, int):
                if shape[at] != dim:
                    return expected + (f" from {origin}" if origin else "")
            elif dim not in sizes:
                sizes[dim], sources[dim] = shape[at], f"its dim {at}"
            elif shape[at] != sizes[dim]:
                return expected + self._cite(dim, at, sizes[dim], sources[dim])
        raise AssertionError(f"{shape} fits {self}")  # only called after match() failed

    @staticmethod
    def _cite(dim: str, at: int, size: int, source: str) -> str:
        if "=" in source:  # bound by a param
            return f" from {source}"
        return f": its dim {at} must equal {source} ({dim} = {size})"

    def render(self, sizes: Mapping[str, int]) -> str:
        """The pattern with the names already bound replaced by their sizes."""
        return self._text(
            [sizes.get(d, d) if isinstance(d, str) else d for d in self.head],
            [sizes.get(d, d) if isinstance(d, str) else d for d in self.tail],
        )

    def _text(self, head: list, tail: list) -> str:
        dims = [*head, BATCH, *tail] if self.batch else tail
        return "[" + ", ".join(str(d) for d in dims) + "]"

    def __str__(self) -> str:
        return self._text(list(self.head), list(self.tail))
