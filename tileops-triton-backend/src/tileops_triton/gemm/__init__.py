"""The GEMM family: `kernels` declares the kernel class, `configs` the autotuning candidates,
`launch` the launcher, `programs` the Triton program; TUNING.md gives the measurements behind
the candidates."""
