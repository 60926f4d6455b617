"""_Gemm: what every GEMM kernel shares (dtype refusal, build identity, the compiled call); the
declarations are in `kernels`."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from tileops import Kernel
from tileops.backend import Build
from tileops.ops import GemmCall, GemmInterface

from .._common.arith import DTYPE_NAMES
from .._common.compile import Launch, build_program
from .._common.operands import aligned
from .tiles import HALF


def dtype_refusal(call: GemmCall) -> str | None:
    if call.dtype in HALF:
        return None
    if call.dtype == torch.float32:
        return (
            "float32 is not served: T.gemm would run it as tf32 (10 mantissa bits) where "
            "torch.mm keeps float32; the Triton or reference kernels serve it"
        )
    return f"{call.dtype} is not served (float16 and bfloat16 only); the reference serves it"


class _Gemm(Kernel, GemmInterface):
    """Base: dtype refusal, build identity (arch, dtype, n, k, layout, bias, plan) and the
    compiled call."""

    # The target's features ("a": sm_90a) and TileLang pass configs (None: its defaults).
    features: ClassVar[str] = ""
    pass_configs: ClassVar[dict[str, Any] | None] = None

    @classmethod
    def refusal(cls, call: GemmCall) -> str | None:
        return dtype_refusal(call) or cls.region_refusal(call)

    @classmethod
    def region_refusal(cls, call: GemmCall) -> str | None:
        return None

    @classmethod
    def plan(cls, call: GemmCall) -> Hashable:
        raise NotImplementedError

    @classmethod
    def entry_for(cls, call: GemmCall) -> tuple[Hashable, Build]:
        plan = cls.plan(call) if call.k else None
        identity = (call.arch, DTYPE_NAMES[call.dtype], call.n, call.k, call.layout,
                    call.has_bias, plan)  # fmt: skip

        def build() -> _Gemm:
            if plan is None:
                return cls(call, [])
            name = f"{cls.__name__}{identity}"
            return cls(call, [cls.compile(name, i, p, call.arch) for i, p in cls.programs(call)])

        return identity, build

    @classmethod
    def compile(cls, name: str, index: int, program: Any, arch: int) -> Any:
        return build_program(
            f"{name}/{index}", program, arch, features=cls.features, pass_configs=cls.pass_configs
        )

    @classmethod
    def programs(cls, call: GemmCall) -> list[tuple[int, Any]]:
        """(index, prim_func factory) of each kernel of the entry, in launch order."""
        raise NotImplementedError

    def __init__(self, call: GemmCall, compiled: list[Any]) -> None:
        self.compiled = compiled
        self.launches = [Launch(program) for program in compiled]
        self.m_dim, self.n_dim = int(call.trans_a), int(not call.trans_b)  # in a's, b's shape

    def output(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """C: (m, n), uninitialised."""
        shape = (a.shape[self.m_dim], b.shape[self.n_dim])
        return torch.empty(shape, dtype=a.dtype, device=a.device)

    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        c = self.output(a, b)
        if not self.compiled:  # k == 0: an empty sum
            return c.zero_() if bias is None else c.copy_(bias.expand_as(c))
        self.launches[0](aligned(a), aligned(b), c, *with_bias(bias))
        return c


def with_bias(bias: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The trailing kernel argument a call with a bias adds (gemm_prim_func's order)."""
    return () if bias is None else (aligned(bias),)
