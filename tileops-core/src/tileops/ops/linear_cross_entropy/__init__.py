"""Fused linear + cross-entropy (see `op` and `_math`)."""

from ._math import CHUNK_BYTES, chunk_rows
from .op import (
    ChunkedLinearCrossEntropy,
    LinearCrossEntropyCall,
    LinearCrossEntropyFwdOp,
    LinearCrossEntropyGradInterface,
    LinearCrossEntropyGradOp,
    LinearCrossEntropyInterface,
)

__all__ = [
    "CHUNK_BYTES",
    "ChunkedLinearCrossEntropy",
    "LinearCrossEntropyCall",
    "LinearCrossEntropyFwdOp",
    "LinearCrossEntropyGradInterface",
    "LinearCrossEntropyGradOp",
    "LinearCrossEntropyInterface",
    "chunk_rows",
]
