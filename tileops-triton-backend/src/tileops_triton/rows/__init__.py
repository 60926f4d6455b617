"""The row-wise family (LayerNorm, RMSNorm, softmax): `kernels` declares the kernel classes,
`plans` the launch rule, `launch` the launchers, `norm_programs` and `softmax_programs` the
Triton programs; TUNING.md gives the measurements behind every constant."""
