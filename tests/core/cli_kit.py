"""A small op for the CLI tests: one interface with a call spec, no kernels of its own, so each
test plants the kernels it needs (gaps, ambiguities, odd declarations) in an isolated registry."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tileops import CallSpec, Kernel, KernelInterface, Op
from tileops.backend import register_kernel_type
from tileops.registry import REGISTRY


class RowsCall(CallSpec):
    n: int
    dtype: torch.dtype


class Rows(KernelInterface):
    call_spec = RowsCall

    def forward(self, x): ...


class RowsOp(Op):
    """Takes no inputs through a signature: the CLI tests only judge its calls."""

    namespace = "cli_kit"
    interfaces = {"rows": Rows}
    kernel_types = {}


def rows_kernel(name: str, refuse=None, **declarations) -> type[Kernel]:
    """A CUDA kernel class for `rows` whose refusal is `refuse(call)` (default: serves all)."""

    def refusal(cls, call):
        return refuse(call) if refuse else None

    namespace = {"refusal": classmethod(refusal), "forward": lambda self, x: x, **declarations}
    return type(name, (Kernel, Rows), namespace)


def plant(**kernels: type[Kernel]) -> None:
    for key, cls in kernels.items():
        register_kernel_type(RowsOp, key, cls)


@contextlib.contextmanager
def rows_op_known() -> Iterator[type[RowsOp]]:
    """RowsOp is known to the registry (so the CLI can name it) only inside the block."""
    REGISTRY.add_op(RowsOp)
    try:
        yield RowsOp
    finally:
        REGISTRY.known_ops.pop(RowsOp.op_name, None)


REGISTRY.known_ops.pop(RowsOp.op_name, None)  # defining it registered it: only tests want it
