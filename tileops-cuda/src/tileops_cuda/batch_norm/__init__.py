"""BatchNorm forward kernels: seven training layouts and inference (`kernels` declares them)."""
