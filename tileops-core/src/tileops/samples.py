"""Sample calls an op declares for conformance checks: constructor params plus inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Case:
    """One call of an op: `op_cls(**params)(*inputs)`. Inputs are float32 CPU masters."""

    params: dict[str, Any]
    inputs: tuple[torch.Tensor | None, ...]
    note: str = field(default="")

    def describe(self) -> str:
        shapes = ", ".join("None" if t is None else str(list(t.shape)) for t in self.inputs)
        params = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"params({params}) inputs({shapes}){' ' + self.note if self.note else ''}"
