"""`import tileops_cuda` registers kernels without importing the compiler."""

from __future__ import annotations

import subprocess
import sys


def test_import_does_not_import_tilelang():
    code = (
        "import sys, tileops, tileops_cuda; from tileops.ops import SoftmaxFwdOp; "
        "SoftmaxFwdOp(-1); print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tilelang', 'tvm', 'tvm_ffi')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
