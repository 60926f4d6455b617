"""GEMM kernels: Hopper (TMA + wgmma), general tensor-core and split-K skinny (see `kernels`)."""
