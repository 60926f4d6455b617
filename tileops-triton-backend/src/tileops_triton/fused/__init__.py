"""Triton kernels of the fused training ops (add + RMSNorm, GLU, rotary), forward and backward."""
