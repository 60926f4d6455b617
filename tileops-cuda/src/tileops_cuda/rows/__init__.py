"""Row-wise kernels: LayerNorm, RMSNorm and softmax forward (`kernels` declares them)."""
