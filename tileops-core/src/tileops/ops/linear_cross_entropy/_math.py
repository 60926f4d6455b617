"""The math of fused linear + cross-entropy, shared by the op, its kernels and its references.

Per counted row i (label y != ignore_index) with logits z = h_i W^T + b over V classes and
label smoothing eps:

    loss_i   = logsumexp(z) - (1 - eps) z_y - eps mean_j(z_j)
    dloss_i  = softmax(z) - (1 - eps) onehot(y) - eps / V          (gradient at z)

Ignored rows give 0 and no gradient. "mean" divides the sum by a divisor: the caller's
`normalizer` (transformers' `num_items_in_batch`: correct under gradient accumulation), else
the number of counted rows, at least 1, so a batch with every row ignored gives 0, not NaN,
with no data-dependent branch (torch.compile). A label outside [0, V) that is not ignored
gives a NaN loss and NaN gradients: never a silently wrong number.

`run_chunks` drives the chunked kernels: one (chunk, V) logits block at a time from a matmul,
a row step (torch here, Triton in the backend) writing the losses and overwriting the block
with its gradient, then the matmuls that fold it into the gradients of hidden, weight, bias.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor
RowStep = Callable[[Tensor, Tensor, "Tensor | None", Tensor], None]
"""`step(logits, labels, scales, losses)`: write each row's loss into `losses` (compute dtype)
and, when `scales` is given, overwrite `logits` with `scales[:, None] * dloss`."""

CHUNK_BYTES = 128 * 2**20
"""The budget of one chunk's logits block: the only (tokens x vocab) memory the op holds.
Each chunk also reads and writes the whole weight gradient once (its accumulation), so fewer,
larger chunks keep that matmul compute-bound: 128 MiB is 512 rows of bfloat16 logits at a
128K vocabulary, where the accumulation's arithmetic intensity (rows / 2 flop per byte)
passes an H200's (about 200)."""

REDUCTIONS = ("mean", "sum", "none")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, else float32: the loss always accumulates in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_rows(vocab: int, element_size: int, budget: int = CHUNK_BYTES) -> int:
    """Rows per chunk so that a (rows, vocab) logits block fits `budget` bytes: a power of two
    (tile-friendly matmuls), at least 1."""
    rows = max(1, budget // max(1, vocab * element_size))
    return 1 << (rows.bit_length() - 1)


def divisor(labels: Tensor, ignore_index: int, normalizer: Tensor | None, dtype: torch.dtype):
    """The mean's denominator as a 0-d tensor of `dtype` (no host sync, no branch on data)."""
    if normalizer is not None:
        return normalizer.to(dtype)
    return (labels != ignore_index).sum().clamp(min=1).to(dtype)


def reduce(losses: Tensor, reduction: str, denominator: Tensor | None) -> Tensor:
    if reduction == "none":
        return losses
    total = losses.sum()
    return total / denominator if reduction == "mean" else total


def row_scales(
    grad_loss: Tensor, labels: Tensor, ignore_index: int, reduction: str, denominator: Tensor
) -> Tensor:
    """Each row's weight on its gradient, in the divisor's dtype: grad_loss (per row for
    "none"), over the divisor for "mean", 0 for ignored rows."""
    dtype = denominator.dtype
    scale = grad_loss.to(dtype)
    if reduction == "mean":
        scale = scale / denominator
    scale = scale.expand(labels.shape)
    return torch.where(labels != ignore_index, scale, torch.zeros((), dtype=dtype))


def torch_step(ignore_index: int, smoothing: float) -> RowStep:
    """The row step in torch: float32 (float64) log-softmax over each row of the block."""

    def step(logits: Tensor, labels: Tensor, scales: Tensor | None, losses: Tensor) -> None:
        vocab = logits.shape[1]
        z = logits.to(losses.dtype)
        lse = torch.logsumexp(z, 1)
        counted = labels != ignore_index
        valid = (labels >= 0) & (labels < vocab)
        index = torch.where(valid, labels, 0).long().unsqueeze(1)
        loss = lse - (1.0 - smoothing) * z.gather(1, index).squeeze(1)
        if smoothing:
            loss = loss - smoothing * z.mean(1)
        nan = torch.full((), float("nan"), dtype=z.dtype, device=z.device)
        loss = torch.where(valid, loss, nan)
        losses.copy_(torch.where(counted, loss, torch.zeros((), dtype=z.dtype)))
        if scales is None:
            return
        grad = torch.exp(z.sub_(lse.unsqueeze(1)))  # softmax, in place of z
        if smoothing:
            grad.sub_(smoothing / vocab)
        hit = torch.full_like(index, -(1.0 - smoothing), dtype=grad.dtype)
        grad.scatter_add_(1, index, hit)
        scale = torch.where(valid | ~counted, scales.to(z.dtype), nan)
        logits.copy_(grad.mul_(scale.unsqueeze(1)))

    return step


def run_chunks(
    step: RowStep,
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    bias: Tensor | None,
    scales: Tensor | None,
    chunk: int,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """(losses per row, grad_hidden, grad_weight, grad_bias) of contiguous inputs, one chunk
    of rows at a time; the gradients only when `scales` is given (grad_bias None without bias).
    grad_weight accumulates chunk by chunk in the weight's dtype, as the matmuls round it."""
    tokens = hidden.shape[0]
    dtype = compute_dtype(hidden.dtype)
    losses = torch.empty(tokens, dtype=dtype, device=hidden.device)
    grads = scales is not None
    grad_hidden = torch.empty_like(hidden) if grads else None
    grad_weight = torch.empty_like(weight) if grads else None
    grad_bias = torch.zeros(weight.shape[0], dtype=dtype, device=hidden.device)
    if grads and not tokens:
        grad_weight.zero_()
    for start in range(0, tokens, chunk):
        end = min(start + chunk, tokens)
        rows = hidden[start:end]
        logits = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
        step(logits, labels[start:end], scales[start:end] if grads else None, losses[start:end])
        if grads:
            torch.mm(logits, weight, out=grad_hidden[start:end])
            if start:
                grad_weight.addmm_(logits.t(), rows)
            else:  # the first chunk writes it: no zeros to fill and read back
                torch.mm(logits.t(), rows, out=grad_weight)
            if bias is not None:
                grad_bias += logits.sum(0, dtype=dtype)
        del logits  # before the next chunk's: one chunk of logits alive at a time
    if not grads or bias is None:
        return losses, grad_hidden, grad_weight, None
    return losses, grad_hidden, grad_weight, grad_bias.to(weight.dtype)


# -- the definitions in plain torch (full logits): references and what autograd differentiates


def full_losses(
    hidden: Tensor, weight: Tensor, labels: Tensor, bias: Tensor | None, ignore_index: int,
    smoothing: float,
) -> Tensor:  # fmt: skip
    """Per-row losses from the full logits, differentiable (the reference definition)."""
    logits = torch.nn.functional.linear(hidden, weight, bias).to(compute_dtype(hidden.dtype))
    vocab = logits.shape[1]
    counted = labels != ignore_index
    valid = (labels >= 0) & (labels < vocab)
    index = torch.where(valid, labels, 0).long().unsqueeze(1)
    logp = torch.log_softmax(logits, 1)
    loss = -(1.0 - smoothing) * logp.gather(1, index).squeeze(1)
    if smoothing:
        loss = loss - smoothing * logp.mean(1)
    nan = torch.full((), float("nan"), dtype=logits.dtype, device=logits.device)
    return torch.where(counted, torch.where(valid, loss, nan), torch.zeros_like(loss))


def full_grads(
    grad_loss: Tensor, hidden: Tensor, weight: Tensor, labels: Tensor, bias: Tensor | None,
    normalizer: Tensor | None, ignore_index: int, smoothing: float, reduction: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(loss, grad_hidden, grad_weight, grad_bias) from the full logits by the closed form,
    in differentiable torch ops (double backward differentiates it)."""
    dtype = compute_dtype(hidden.dtype)
    denominator = divisor(labels, ignore_index, normalizer, dtype)
    losses = full_losses(hidden, weight, labels, bias, ignore_index, smoothing)
    loss = reduce(losses, reduction, denominator)
    logits = torch.nn.functional.linear(hidden, weight, bias).to(dtype)
    vocab = logits.shape[1]
    valid = (labels >= 0) & (labels < vocab)
    index = torch.where(valid, labels, 0).long()
    target = torch.nn.functional.one_hot(index, vocab).to(dtype) * (1.0 - smoothing)
    scales = row_scales(grad_loss, labels, ignore_index, reduction, denominator)
    nan = torch.full((), float("nan"), dtype=dtype, device=hidden.device)
    scales = torch.where(valid | (labels == ignore_index), scales, nan)
    dz = (torch.softmax(logits, 1) - target - smoothing / vocab) * scales.unsqueeze(1)
    dz = dz.to(hidden.dtype)
    grad_bias = dz.sum(0) if bias is not None else torch.zeros_like(weight[:, 0])
    return loss, dz @ weight, dz.t() @ hidden, grad_bias
