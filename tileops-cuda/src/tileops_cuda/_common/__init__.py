"""What every kernel family shares: size arithmetic (`arith`), a block's lanes (`lanes`), the
compiled tensors' operands (`operands`), compilation and the disk cache (`compile`) and the
TileLang building blocks (`tiles`, imported only inside builds)."""
