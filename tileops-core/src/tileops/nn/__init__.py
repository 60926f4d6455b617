"""`tileops.nn`: drop-in replacements for torch.nn modules that run through tileops ops, and
`kernelize`, which swaps them into an existing model in place, together with the norm classes
of other libraries whose semantics are declared (`register_module_semantics`); and
`register_transformers_attention`, which makes `attn_implementation="tileops"` available to
transformers models; and the fused training ops as functions and modules (`add_rms_norm` /
`AddRMSNorm`, `glu` / `SwiGLU`, `apply_rotary_pos_emb`), which kernelize also reaches in
transformers' gated MLPs and attention.

Import it explicitly (`import tileops.nn`); `import tileops` does not load it.
"""

from __future__ import annotations

from .activation import Softmax
from .attention import MultiheadAttention
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .causal_lm import kernelize_loss
from .fused import AddRMSNorm, SwiGLU, add_rms_norm, apply_rotary_pos_emb, glu
from .hf_attention import register_transformers_attention
from .kernelize import KERNELIZED, KernelizeReport, Skipped, Swapped, kernelize
from .linear import Linear
from .loss import LinearCrossEntropyLoss, linear_cross_entropy
from .normalization import LayerNorm, RMSNorm
from .semantics import ModuleSemantics, declared_semantics, register_module_semantics

__all__ = [
    "KERNELIZED",
    "AddRMSNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "KernelizeReport",
    "LayerNorm",
    "Linear",
    "LinearCrossEntropyLoss",
    "ModuleSemantics",
    "MultiheadAttention",
    "RMSNorm",
    "Skipped",
    "Softmax",
    "SwiGLU",
    "Swapped",
    "add_rms_norm",
    "apply_rotary_pos_emb",
    "declared_semantics",
    "glu",
    "kernelize",
    "kernelize_loss",
    "linear_cross_entropy",
    "register_module_semantics",
    "register_transformers_attention",
]
