"""The main job: run every op through the dispatcher and show how each call was served.

Each op runs on this machine's device and is compared with the torch function it matches; an
op with no kernel installed for that device says so and runs on the CPU instead. Then the
dispatcher explains its choice for one call here, and for the same call on a simulated H200.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import tileops
from tileops.testing import simulate_device


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(4, 64, 256, device=device)
    w, b = torch.randn(256, device=device), torch.randn(256, device=device)
    a, m = torch.randn(128, 96, device=device), torch.randn(96, 64, device=device)
    img = torch.randn(8, 16, 10, 10, device=device)
    mean, var = torch.zeros(16, device=device), torch.ones(16, device=device)
    runs = [
        ("LayerNormFwdOp", tileops.LayerNormFwdOp(256), (x, w, b), F.layer_norm(x, (256,), w, b)),
        ("RMSNormFwdOp", tileops.RMSNormFwdOp(256), (x, w), F.rms_norm(x, (256,), w)),
        ("SoftmaxFwdOp", tileops.SoftmaxFwdOp(dim=1), (x,), torch.softmax(x, 1)),
        (
            "BatchNormFwdOp",
            tileops.BatchNormFwdOp(16, training=False),
            (img, None, None, mean, var),
            F.batch_norm(img, mean, var),
        ),
        ("GemmOp", tileops.GemmOp(), (a, m), a @ m),
    ]
    print(f"tileops {tileops.__version__} on {device}\n")
    for name, op, args, expected in runs:
        try:
            result = op(*args)
        except tileops.OpNotAvailableError as exc:
            print(f"{name:<16} {str(exc).splitlines()[0]} Running on cpu instead.")
            args, expected = _to_cpu(args), expected.cpu()
            result = op(*args)
        error = (result - expected).abs().max().item()
        print(f"{name:<16} max |error| vs torch = {error:.2e}  (target: {op.settled_target})")
    print()
    rms = tileops.RMSNormFwdOp(256)
    call = tileops.ops.RMSNormCall(device=device, n=256, eps=1e-6, dtype=x.dtype, has_weight=True)
    print(rms.explain("rms_norm", call), end="\n\n")
    with simulate_device("cuda:0", arch=90, sm_count=132, calibration="NVIDIA H200"):
        h200 = tileops.ops.RMSNormCall(
            device=torch.device("cuda:0"), n=4096, eps=1e-6, dtype=torch.bfloat16, has_weight=True
        )
        print("On a (simulated) H200:")
        print(rms.explain("rms_norm", h200))


def _to_cpu(args: tuple) -> tuple:
    return tuple(None if a is None else a.cpu() for a in args)


if __name__ == "__main__":
    main()
