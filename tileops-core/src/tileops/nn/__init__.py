"""`tileops.nn`: drop-in replacements for torch.nn modules that run through tileops ops, and
`kernelize`, which swaps them into an existing model in place.

Import it explicitly (`import tileops.nn`); `import tileops` does not load it.
"""

from __future__ import annotations

from .activation import Softmax
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .kernelize import KERNELIZED, KernelizeReport, Skipped, Swapped, kernelize
from .linear import Linear
from .normalization import LayerNorm, RMSNorm

__all__ = [
    "KERNELIZED",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "KernelizeReport",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "Skipped",
    "Softmax",
    "Swapped",
    "kernelize",
]
