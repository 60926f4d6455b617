"""`Linear`: torch.nn's module, multiplying through `GemmOp`.

Weight layout, and what a call copies. The weight stays in torch's (out, in) row-major layout:
state_dict, tied weights (an embedding shared with an output projection), views, FSDP/DDP and
kernelize's "same tensors" rule all depend on it. GemmOp takes a (m, k) @ (k, n) pair of
contiguous tensors, so `x @ W^T` needs a transposed copy of something. Each call picks the
cheaper of two exact formulations (m rows of x, k = in_features, n = out_features):

- weight route, `x @ (W^T copy)`: copies k*n elements; for many rows (training, prefill).
- token route, `(W @ x^T)^T`: copies x^T and the result, m*(k+n) elements; for few rows
  (decode: with m = 1 both transposes are free views).

So no call copies more than min(k*n, m*(k+n)) elements, and nothing is held between calls. A
weight whose transpose is already contiguous (a column-major weight) is used as is, copy-free.
A W^T cache keyed on `weight._version` was rejected: it holds a second copy of every weight
(doubling weight memory in inference, where it would hit), misses on every training step
(the optimizer bumps the version), and would have to be keyed on grad and inference mode too.
The copy goes away for good once GemmOp offers a (n, k) "nt" layout for b, as cuBLAS does.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import OpInputError
from ..ops import GemmOp
from ._base import TileModule
from ._ops import op_for


class Linear(TileModule, nn.Linear):
    """`torch.nn.Linear` (same arguments): `y = x @ W^T + b` over any leading dims via GemmOp.

    The bias is added after the GEMM, in the op's dtype (GemmOp has no bias epilogue).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise OpInputError(
                f"tileops.nn.Linear: argument 'input' of shape {list(x.shape)} cannot be "
                f"multiplied by weight of shape {list(self.weight.shape)}; its last dim must "
                f"be in_features={self.in_features}"
            )
        rows = x.reshape(x.shape[:-1].numel(), self.in_features)  # -1 fails for in_features 0
        y = _matmul_wt(op_for(GemmOp, x.device), rows, self.weight)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)  # under autocast F.linear casts the bias too
        if x.dim() == 2:  # no view, as F.linear's: FSDP2 drops hooks on in-place ops on views
            return y
        return y.view(*x.shape[:-1], self.out_features)


def _matmul_wt(gemm: GemmOp, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`rows @ weight^T` through `gemm`, by the route that copies less (see the module doc)."""
    (m, k), n = rows.shape, weight.shape[0]
    weight_t = weight.t()
    if weight_t.is_contiguous() or m * (k + n) >= k * n:
        return gemm(rows, weight_t)
    return gemm(weight, rows.t()).t().contiguous()
