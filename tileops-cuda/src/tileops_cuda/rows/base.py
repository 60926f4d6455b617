"""RowKernel: what every TileLang row kernel shares (dtype refusal, plan, build identity, the
compiled call); the declarations of each layout and family are in `kernels`."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from tileops import Kernel

from .._common.arith import AMPERE_AND_LATER, DTYPE_NAMES, ITEMSIZE
from .._common.compile import Launch, build_program
from .._common.operands import aligned, all_aligned
from .plans import RowPlan, long_row_plan, warp_rows_plan, with_occupancy


class RowKernel(Kernel):
    """Base of the TileLang row kernels: dtype refusal, build identity and the compiled call.

    Subclasses declare `layout` (which plan), their region (`region_refusal`) and
    `program(plan, call)`, the TileLang program factory for one build identity.
    """

    supported_archs = AMPERE_AND_LATER
    layout: ClassVar[str]

    @classmethod
    def refusal(cls, call: Any) -> str | None:
        if call.dtype not in ITEMSIZE:
            return (
                f"{call.dtype} is not served: these kernels compute in float32, which would "
                "lose float64 precision; the torch reference kernels serve it"
            )
        return cls.region_refusal(call)

    @classmethod
    def region_refusal(cls, call: Any) -> str | None:
        raise NotImplementedError

    @classmethod
    def plan(cls, call: Any) -> RowPlan:
        if cls.layout == "warp_rows":
            plan = warp_rows_plan(call.n, call.dtype)
        elif cls.layout == "block_row":
            plan = cls.block_plan(call)
        elif cls.layout == "cluster_row":
            plan = cls.cluster_plan(call)
        elif cls.layout == "smem_row":
            plan = cls.smem_plan(call)
        else:
            plan = long_row_plan(call.n, call.dtype, "none")
        return with_occupancy(plan, call)

    @classmethod
    def build_fields(cls, call: Any) -> tuple[Hashable, ...]:
        """Call-spec fields that change the compiled code besides dtype and n (eps, affine)."""
        return ()

    @classmethod
    def entry_for(cls, call: Any) -> tuple[Hashable, Any]:
        """Identity: arch, dtype, n, the plan (which the device facts shape) and the family's
        baked-in fields."""
        plan = cls.plan(call)
        identity = (call.arch, DTYPE_NAMES[call.dtype], call.n, plan, *cls.build_fields(call))

        return identity, lambda: cls.build(plan, call, f"{cls.__name__}{identity}")

    @classmethod
    def build(cls, plan: RowPlan, call: Any, name: str) -> RowKernel:
        """The kernel of `plan` for `call`, compiled once across processes under `name`. Partials
        exchanged in shared memory (RowPlan.dsmem) arrive while the block still reduces, so its
        buffers each keep a region of their own (no reuse of a buffer TileLang deems dead)."""
        configs = {"tl.disable_shared_memory_reuse": True} if plan.dsmem else None
        program = build_program(name, cls.program(plan, call), call.arch, pass_configs=configs)
        return cls(program, plan)

    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        raise NotImplementedError

    def __init__(self, compiled: Any, plan: RowPlan) -> None:
        self.compiled = compiled
        self.launch = Launch(compiled)
        self.plan = plan

    def rows_out(self, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        """y of the program on the (rows, n) `x` and the params it takes (the hot path of
        every row op's forward: one allocation, one launch)."""
        if not all_aligned(x, *params):
            x, *params = map(aligned, (x, *params))
        y = torch.empty_like(x)
        if self.plan.global_partials:
            self.launch.entry(x, *params, *self.workspace(x), y)
        else:
            self.launch.entry(x, *params, y)
        return y

    def workspace(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The cluster's exchange of partial statistics, (rows, cluster, 2) float32; none
        without a cluster or with RowPlan.dsmem."""
        if not self.plan.global_partials:
            return ()
        shape = (x.shape[0], self.plan.cluster, 2)
        return (torch.empty(shape, dtype=torch.float32, device=x.device),)
