"""Triton's fused linear + cross-entropy: the row step of the chunked kernels."""
