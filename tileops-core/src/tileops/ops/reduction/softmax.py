"""Softmax where upstream TileOPs keeps it; the op itself lives in `tileops.ops.softmax`."""

from __future__ import annotations

from ..softmax import SoftmaxCall, SoftmaxFwdOp, SoftmaxInterface

__all__ = ["SoftmaxCall", "SoftmaxFwdOp", "SoftmaxInterface"]
