"""What tests and backend authors need: an isolated registry, simulated devices, and a
conformance check of a backend's kernels against the reference kernels."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .backend import register_kernel_type
from .control import pinned
from .device import SIMULATED, DeviceFacts, Simulation, simulating
from .kernel import Kernel
from .op import Op
from .ops._common import sample_case
from .plugins import LOADER
from .provenance import Source
from .registry import BUILTIN, REGISTRY
from .samples import Case
from .signature import dtype_name

__all__ = [
    "Case",
    "ConformanceReport",
    "Simulation",
    "case",
    "check_conformance",
    "cpu_twin",
    "isolated_registry",
    "simulate_device",
]


@contextlib.contextmanager
def isolated_registry(backends: Iterable[str] | None = None) -> Iterator[None]:
    """Undo, on exit, every registration, operator preference and default-target change made
    inside, in this thread or task (and threads run in a copy of its context).

    `backends` (entry point or distribution names): inside the block, only these backends'
    registrations stand; every other installed backend's are withdrawn, and return on exit.
    A backend's tests then see the registry they would see were it installed alone, whatever
    else the machine has installed (another target claiming the same device, another key
    tying with theirs). The ops' own kernels always stay.

    The registry is process-wide, and so is this block: what is registered inside is seen by
    every thread while the block lasts, and what other threads register meanwhile is theirs and
    survives the exit. It isolates a test from the tests after it, not from threads running
    beside it. (Per-thread registrations would make every op construction and table lookup
    depend on the caller's context, where they now share one table per op class.)
    """
    LOADER.ensure_loaded()
    with REGISTRY.transaction(always_undo=True):
        if backends is not None:
            _keep_only(backends)
        yield


def _keep_only(backends: Iterable[str]) -> None:
    """Withdraw the registrations of every loaded backend not named in `backends`."""
    wanted = {backends} if isinstance(backends, str) else set(backends)
    loaded = LOADER.infos.values()
    known = {b.entry_point for b in loaded} | {b.distribution for b in loaded}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(
            f"isolated_registry(backends=...): {', '.join(map(repr, unknown))} names no loaded "
            f"backend; loaded: {', '.join(sorted(b.entry_point for b in loaded)) or 'none'}"
        )
    for info in loaded:
        if info.entry_point not in wanted and info.distribution not in wanted:
            REGISTRY.withdraw_source(Source(info.distribution, info.entry_point))


@contextlib.contextmanager
def simulate_device(
    device: torch.device | str,
    *,
    arch: int | None,
    sm_count: int,
    calibration: str | None = None,
    smem_budget: int = 0,
) -> Iterator[Simulation]:
    """Make the facts of `device` these values inside the block, GPU or not, for this thread
    or asyncio task only: other threads keep their own facts, and selections made here never
    serve them. A thread started inside does not inherit it (Python threads start with an
    empty context) unless it runs in `contextvars.copy_context()`.

    The yielded object's `.reads` counts how often the dispatcher read them.
    """
    facts = DeviceFacts(
        arch=arch, sm_count=sm_count, calibration=calibration, smem_budget=smem_budget
    )
    with simulating(Simulation(torch.device(device), facts)) as simulation:
        yield simulation


@dataclass(frozen=True)
class Mismatch:
    case: str
    dtype: torch.dtype
    detail: str

    def __str__(self) -> str:
        return f"{self.case} [{dtype_name(self.dtype)}]: {self.detail}"


@dataclass
class ConformanceReport:
    """What `check_conformance` found. `ok` means no mismatch and at least one call exercised."""

    subject: str
    checked: int = 0
    not_served: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.checked > 0 and not self.mismatches

    def __str__(self) -> str:
        lines = [
            f"{self.subject}: {self.checked} calls checked, {len(self.mismatches)} mismatches, "
            f"{len(self.not_served)} calls not served by it"
        ]
        lines += [f"  mismatch: {m}" for m in self.mismatches]
        return "\n".join(lines)


TOLERANCES = {
    torch.float64: 1e-5,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}
"""Absolute and relative tolerance per dtype of `check_conformance`'s comparisons (float64:
loose enough for a kernel that computes a float64 call in float32 and rounds once)."""


def check_conformance(
    op_cls: type[Op],
    *,
    kernel: tuple[str, type[Kernel]] | None = None,
    target: str | None = None,
    device: torch.device | str = "cpu",
    dtypes: Sequence[torch.dtype] | None = None,
    cases: Iterable[Case] = (),
) -> ConformanceReport:
    """Run `op_cls` over its sample cases and `cases` on `device`, through `kernel` (a key and
    class, registered for the check) or `target`, and compare with the op's own kernels.

    What it covers: every case in every dtype of `dtypes` (default: every dtype the op's first
    input takes), each output and each input the op writes (BatchNorm's running stats),
    within `TOLERANCES` of the reference kernels run on the CPU; that every other input is
    left exactly as it was and no output shares memory with an input; for a kernel, which
    calls it actually served (`report.not_served` lists the others, which are not compared).
    What it does not: refusal sentences, preferences against other backends' keys, speed,
    autograd.
    The op's sample cases are few and small and reach none of your kernel's refusal
    boundaries: pass `cases` (see `case()`) on both sides of each boundary you declare.

    Without a GPU, `device="cuda"` inside `simulate_device("cuda", ...)` checks a kernel's
    numerics on the CPU: the kit builds a CPU twin of the class (the same class, declared for
    `cpu` too) and runs it on CPU tensors, with the CPU simulated as that GPU (same arch, SM
    count...), so refusals and build identities see the facts they would on it. That runs the
    kernel's Python: right for a kernel written in torch, or in Triton under
    `TRITON_INTERPRET=1`; a compiled CUDA kernel needs the GPU.
    """
    if (kernel is None) == (target is None):
        raise ValueError("check_conformance: pass exactly one of kernel=(key, cls) or target=")
    twin = _cpu_twin_simulation(kernel, torch.device(device))
    if twin is not None:
        key, cls = kernel
        if op_cls.kernel_types.get(key) is cls:  # an in-tree kernel: its twin needs a key
            key = f"{key}_cpu_twin"
        facts = twin.facts
        with simulate_device(
            "cpu",
            arch=facts.arch,
            sm_count=facts.sm_count,
            calibration=facts.calibration,
            smem_budget=facts.smem_budget,
        ):
            report = check_conformance(
                op_cls, kernel=(key, cpu_twin(cls)), dtypes=dtypes, cases=cases
            )
        report.subject += f" (a CPU twin, the CPU simulated as {twin.device})"
        return report
    subject = f"{op_cls.op_name} via " + (
        f"kernel {kernel[0]!r}" if kernel else f"target {target!r}"
    )
    report = ConformanceReport(subject)
    every = [*op_cls.sample_cases(), *cases]
    calls = [(c, d) for c in every for d in dtypes or _dtypes(op_cls, c)]
    cpu = torch.device("cpu")
    in_tree = kernel is not None and op_cls.kernel_types.get(kernel[0]) is kernel[1]
    with isolated_registry():
        # Expected values come from the op's own general (reference) kernels alone: withdraw
        # what backends added (the kernel under test may be installed already) and pin the
        # general kernels (an in-tree kernel under test is one of the op's own), then register
        # the kernel under test, unless it is the op's own already (checked in place).
        REGISTRY.withdraw_kernel_types(op_cls)
        with _general_kernels_only(op_cls):
            expected = [
                _run(op_cls(**c.params, target=BUILTIN), _cast(c.inputs, d, cpu)) for c, d in calls
            ]
        if kernel is not None and not in_tree:
            register_kernel_type(op_cls, *kernel)
        for (case, dtype), want in zip(calls, expected, strict=False):
            op = op_cls(**case.params, target=target or BUILTIN)
            served = _spy_keys(op) if kernel else None
            inputs = _cast(case.inputs, dtype, torch.device(device))
            before = _cast(inputs, dtype, torch.device(device))
            got = _run(op, inputs)
            if served is not None and kernel[0] not in served:
                report.not_served.append(f"{case.describe()} [{dtype_name(dtype)}]")
                continue
            report.checked += 1
            _compare(case, dtype, got, want, report)
            for detail in _input_problems(op, inputs, before, got[: len(op.signature.outputs)]):
                report.mismatches.append(Mismatch(case.describe(), dtype, detail))
    return report


@contextlib.contextmanager
def _general_kernels_only(op_cls: type[Op]) -> Iterator[None]:
    """Pin each interface of `op_cls` that has a general kernel of its own to that kernel."""
    with contextlib.ExitStack() as stack:
        for name, interface in op_cls.interfaces.items():
            general = [
                key
                for key, cls in op_cls.kernel_types.items()
                if issubclass(cls, interface) and cls.general
            ]
            if general:
                stack.enter_context(pinned(op_cls, name, general[0]))
        yield


def cpu_twin(cls: type[Kernel]) -> type[Kernel]:
    """`cls`, declared to run on the CPU as well: what `check_conformance` runs on CPU tensors
    for a CUDA kernel on a machine without a GPU."""
    devices = frozenset(cls.devices) | {"cpu"}
    return type(
        f"{cls.__name__}CpuTwin", (cls,), {"devices": devices, "__module__": cls.__module__}
    )


def _cpu_twin_simulation(
    kernel: tuple[str, type[Kernel]] | None, device: torch.device
) -> Simulation | None:
    """The simulation of `device` to run a CPU twin under, when `kernel` is checked on a CUDA
    device this machine lacks; None to check on `device` itself."""
    if kernel is None or device.type != "cuda" or torch.cuda.is_available():
        return None
    simulation = SIMULATED.get().get(device)
    if simulation is None:
        raise ValueError(
            f"check_conformance(device={str(device)!r}): this machine has no CUDA device; to "
            "check the kernel's numerics on CPU tensors (a CPU twin), call it inside "
            f"tileops.testing.simulate_device({str(device)!r}, arch=..., sm_count=...)"
        )
    return simulation


def case(params: Mapping[str, Any], *shapes: tuple[int, ...] | None, note: str = "") -> Case:
    """A conformance case: `op_cls(**params)` called on seeded random float32 CPU inputs of
    `shapes` (None: leave that optional input out), cast to each dtype checked. For example
    `case({"normalized_shape": (1025,)}, (4, 1025), (1025,), note="just past 1024")`."""
    return sample_case(params, *shapes, note=note)


def _dtypes(op_cls: type[Op], case: Case) -> list[torch.dtype]:
    signature = op_cls(**case.params).signature
    return [d for d in signature.inputs[0].dtypes if isinstance(d, torch.dtype)]


def _run(op: Op, inputs: tuple) -> list[torch.Tensor]:
    """Every output of one call, then every input the op wrote."""
    result = op(*inputs)
    outputs = list(result) if isinstance(result, tuple) else [result]
    specs = op.signature.inputs
    written = [t for s, t in zip(specs, inputs, strict=False) if s.written and t is not None]
    return outputs + written


def _compare(case: Case, dtype, got, want, report: ConformanceReport) -> None:
    tolerance = TOLERANCES.get(dtype, 0.0)  # an integer output: exact
    for index, (actual, expected) in enumerate(zip(got, want, strict=False)):
        try:
            torch.testing.assert_close(
                actual.cpu().double(),  # float64 calls are compared at their own precision
                expected.double(),
                rtol=tolerance,
                atol=tolerance,
                equal_nan=True,
            )
        except AssertionError as exc:
            detail = f"output {index}: " + " ".join(str(exc).split())
            report.mismatches.append(Mismatch(case.describe(), dtype, detail))


def _input_problems(op: Op, inputs: tuple, before: tuple, outputs: list[torch.Tensor]) -> list[str]:
    """What the call did to its inputs that a kernel must not do: change one the op does not
    write (the caller's tensor, when it already had the kernel's layout), or hand one back as
    an output (the op's result would be the caller's input)."""
    problems = []
    for spec, now, then in zip(op.signature.inputs, inputs, before, strict=True):
        if now is None:
            continue
        if not spec.written and not _unchanged(now, then):
            problems.append(
                f"input {spec.name!r} was changed by the call; the op does not write it, so a "
                "kernel must leave it as it was"
            )
        problems += [
            f"output {index} shares memory with input {spec.name!r}; return a new tensor"
            for index, out in enumerate(outputs)
            if _shares_memory(out, now)
        ]
    return problems


def _unchanged(now: torch.Tensor, then: torch.Tensor) -> bool:
    """Every element as it was (NaN where it was NaN)."""
    try:
        torch.testing.assert_close(now, then, rtol=0, atol=0, equal_nan=True)
    except AssertionError:
        return False
    return True


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    pointer = a.untyped_storage().data_ptr()
    return pointer != 0 and pointer == b.untyped_storage().data_ptr()


def _spy_keys(op: Op) -> list[str]:
    """Record which key serves each kernel_for call of this one op instance."""
    served: list[str] = []
    original = op.kernel_for

    def kernel_for(interface, call):
        served.append(op.key_for(interface, call))
        return original(interface, call)

    op.kernel_for = kernel_for
    return served


def _cast(inputs: tuple, dtype: torch.dtype, device: torch.device) -> tuple:
    """Fresh copies, so ops that write their inputs cannot disturb the next run."""
    return tuple(
        None
        if t is None
        else t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype, copy=True)
        for t in inputs
    )
