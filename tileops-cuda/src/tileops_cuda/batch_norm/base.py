"""_BatchNorm: what every BatchNorm kernel shares (dtype refusal, build identity, the compiled
call with placeholders for absent per-channel tensors); the declarations are in `kernels`."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from tileops import Kernel
from tileops.backend import Build
from tileops.ops import BatchNormCall

from .._common.arith import AMPERE_AND_LATER, DTYPE_NAMES, ITEMSIZE
from .._common.compile import Launch, build_program
from .._common.operands import aligned
from .plans import param_dtype


def dtype_refusal(call: BatchNormCall) -> str | None:
    if call.dtype in ITEMSIZE:
        return None
    return (
        f"{call.dtype} is not served: these kernels compute in float32, which would lose "
        "float64 precision; the torch reference kernels serve it"
    )


class _BatchNorm(Kernel):
    """Base of the BatchNorm kernels: dtype refusal, build identity and the compiled call.

    Absent per-channel tensors are passed as one (channels,) placeholder that the program never
    reads: one kernel signature for every affine / running-stats combination.
    """

    supported_archs = AMPERE_AND_LATER

    @classmethod
    def refusal(cls, call: BatchNormCall) -> str | None:
        return dtype_refusal(call) or cls.region_refusal(call)

    @classmethod
    def region_refusal(cls, call: BatchNormCall) -> str | None:
        return None

    @classmethod
    def layout_fields(cls, call: BatchNormCall) -> tuple[Hashable, ...]:
        """What, besides the common fields, shapes this layout's code (its plan)."""
        return ()

    @classmethod
    def entry_for(cls, call: BatchNormCall) -> tuple[Hashable, Build]:
        """Identity: arch, dtypes, the layer's channels and spatial size, eps, momentum, which
        tensors are given, and the layout's plan; the batch size is symbolic."""
        identity = (
            call.arch,
            DTYPE_NAMES[call.dtype],
            DTYPE_NAMES[param_dtype(call)],
            call.channels,
            call.spatial,
            call.eps,
            call.momentum,
            call.has_weight,
            call.has_bias,
            call.has_running_stats,
            *cls.layout_fields(call),
        )

        def build() -> _BatchNorm:
            name = f"{cls.__name__}{identity}"
            programs = cls.programs(call)
            return cls(call, [build_program(f"{name}/{k}", p, call.arch) for k, p in programs])

        return identity, build

    @classmethod
    def programs(cls, call: BatchNormCall) -> list[tuple[int, Any]]:
        """(index, prim_func factory) of each kernel of the entry, in launch order."""
        raise NotImplementedError

    def __init__(self, call: BatchNormCall, compiled: list[Any]) -> None:
        self.compiled = compiled
        self.launches = [Launch(program) for program in compiled]
        self.channels = call.channels
        self.pdtype = param_dtype(call)
        self._placeholders: dict[torch.device, torch.Tensor] = {}

    def forward(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """One kernel over x (the split layout, two kernels, has its own): y, and in training
        the batch mean and invstd it kept (`kept`)."""
        x = aligned(x)
        y, kept = torch.empty_like(x), self.kept(x)
        params = self.per_channel(x, weight, bias, running_mean, running_var)
        outputs = (y,) if kept is None else (y, kept)
        self.launches[0](x, *params, *self.workspace(x), *outputs)
        return y if kept is None else (y, *kept)

    def kept(self, x: torch.Tensor) -> torch.Tensor | None:
        """The (2, channels) float32 buffer a training program keeps its statistics in; None
        for inference."""
        return None

    def workspace(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Scratch tensors the kernel takes before y: none but a cluster's."""
        return ()

    def per_channel(self, x: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor]:
        """The per-channel tensors, a placeholder where one is absent."""
        if all(t is not None for t in tensors):
            return list(tensors)
        spare = self._placeholders.get(x.device)
        if spare is None:
            spare = torch.empty(self.channels, dtype=self.pdtype, device=x.device)
            self._placeholders[x.device] = spare
        return [spare if t is None else t for t in tensors]
