"""Sizes and architectures every family computes with: pure arithmetic, no tilelang, no device."""

from __future__ import annotations

import torch

ITEMSIZE = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

# The widest load one thread issues (ld.global.v4.b32): vectors are 16 bytes or a divisor of n.
VECTOR_BYTES = 16
WARP = 32
MAX_THREADS = 1024
# Archs the kernels are compiled and checked for; nothing in them needs more than sm_80.
AMPERE_AND_LATER = frozenset({80, 86, 89, 90})
CLUSTER_ARCHS = frozenset({90})  # thread-block clusters: sm_90 and later
# Cluster sizes the kernels launch; 16 is beyond the portable sizes (the launcher sets the
# non-portable attribute).
CLUSTER_SIZES = (2, 4, 8, 16)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(value: int, multiple: int) -> int:
    return ceil_div(value, multiple) * multiple


def pow2_ceil(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


def vector_width(n: int, dtype: torch.dtype) -> int:
    """The widest power-of-two vector of at most 16 bytes that divides n (so every row starts
    aligned: rows are n elements apart)."""
    vec = VECTOR_BYTES // ITEMSIZE[dtype]
    while n % vec:
        vec //= 2
    return vec
