"""Reductions under upstream TileOPs' module names: `tileops.ops.reduction.softmax`."""
