"""`tileops.nn`: drop-in replacements for torch.nn modules that run through tileops ops, and
`kernelize`, which swaps them into an existing model in place, together with the norm classes
of other libraries whose semantics are declared (`register_module_semantics`).

Import it explicitly (`import tileops.nn`); `import tileops` does not load it.
"""

from __future__ import annotations

from .activation import Softmax
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .kernelize import KERNELIZED, KernelizeReport, Skipped, Swapped, kernelize
from .linear import Linear
from .normalization import LayerNorm, RMSNorm
from .semantics import ModuleSemantics, declared_semantics, register_module_semantics

__all__ = [
    "KERNELIZED",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "KernelizeReport",
    "LayerNorm",
    "Linear",
    "ModuleSemantics",
    "RMSNorm",
    "Skipped",
    "Softmax",
    "Swapped",
    "declared_semantics",
    "kernelize",
    "register_module_semantics",
]
