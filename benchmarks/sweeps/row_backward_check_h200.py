"""The TileLang norm backward kernels alone against float64 autograd, on a lent GPU in a few
minutes: the kernels compile in parallel processes first (the GPU test compiles one at a time).

    python benchmarks/sweeps/row_backward_check_h200.py
"""

import concurrent.futures
import multiprocessing
import time

import torch
import torch.nn.functional as F

CASES = []
for kind in ("rms", "layer"):
    for n, rows in ((1, 37), (7, 37), (1000, 300), (1000, 5000), (4096, 64), (4096, 1000),
                    (8192, 300), (16384, 9), (16384, 300), (32768, 20), (65536, 70)):  # fmt: skip
        for dtype in ("bfloat16", "float32", "float16"):
            for affine in ("both", "none", "fp32"):
                if dtype != "bfloat16" and affine == "fp32":
                    continue
                if dtype == "float16" and n not in (1000, 4096, 16384):
                    continue
                CASES.append((kind, n, rows, dtype, affine))


def setup(case):
    from tileops.backward import backward_call
    from tileops.ops import LayerNormFwdOp, RMSNormFwdOp

    kind, n, rows, dtype, affine = case
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(n + rows)
    x = (torch.randn(rows, n, device="cuda", generator=g) * 3 + 2).to(dt)
    dy = torch.randn(rows, n, device="cuda", generator=g).to(dt)
    pdt = torch.float32 if affine == "fp32" else dt
    w = None if affine == "none" else torch.randn(n, device="cuda", generator=g).to(pdt)
    b = None if affine == "none" else torch.randn(n, device="cuda", generator=g).to(pdt)
    if kind == "rms":
        op, tensors = RMSNormFwdOp(n, 1e-6), (x, w)
    else:
        op, tensors = LayerNormFwdOp(n), (x, w, b)
    needs = tuple(t is not None for t in tensors)
    call = backward_call(op, (dy,), tensors, (), needs, False)
    return op, tensors, dy, call


def kernel_class(kind):
    from tileops_cuda.rows import backward_kernels as bk

    return bk.TileLangRMSNormBackward if kind == "rms" else bk.TileLangLayerNormBackward


def prebuild(case):
    op, tensors, dy, call = setup(case)
    cls = kernel_class(case[0])
    if cls.refusal(call) is None:
        cls.entry_for(call)[1]()


def main():
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(12, mp_context=ctx) as pool:
        list(pool.map(prebuild, CASES))
    print(f"prebuilt {len(CASES)} cases in {time.time() - t0:.0f}s", flush=True)
    worst, failed, served = {}, 0, 0
    for case in CASES:
        kind, n, rows, dtype, affine = case
        op, tensors, dy, call = setup(case)
        cls = kernel_class(kind)
        refusal = cls.refusal(call)
        if refusal is not None:
            print("refused", case, refusal[:80])
            continue
        identity, build = cls.entry_for(call)
        kernel = build()
        got = kernel.forward((dy,), tensors)
        torch.cuda.synchronize()
        ref_in = [None if t is None else t.double().requires_grad_() for t in tensors]
        if kind == "rms":
            y = F.rms_norm(ref_in[0], (n,), ref_in[1], 1e-6)
        else:
            y = F.layer_norm(ref_in[0], (n,), ref_in[1], ref_in[2], 1e-5)
        y.backward(dy.double())
        low = getattr(torch, dtype)  # torch's own kernels in x's dtype: the baseline error
        low_in = [None if t is None else t.detach().to(low).requires_grad_() for t in tensors]
        if kind == "rms":
            yl = F.rms_norm(low_in[0], (n,), low_in[1], 1e-6)
        else:
            yl = F.layer_norm(low_in[0], (n,), low_in[1], low_in[2], 1e-5)
        yl.backward(dy)
        served += 1
        for name, a, r, low in zip(("dx", "dw", "db"), got, ref_in, low_in, strict=False):
            if r is None:
                continue
            want = r.grad
            err = float((a.double() - want).norm() / want.norm().clamp_min(1e-30))
            base = float((low.grad.double() - want).norm() / want.norm().clamp_min(1e-30))
            tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.5e-2}[dtype]
            ok = err < max(tol, 2 * base) and torch.isfinite(a).all()
            if not ok:
                failed += 1
                print("FAIL", case, name, f"err {err:.2e} torch's {base:.2e}", identity[-1])
            worst[(kind, dtype, name)] = max(worst.get((kind, dtype, name), 0), err)
    print(f"served {served}, failed {failed}")
    for k, v in sorted(worst.items()):
        print("worst", k, f"{v:.2e}")


if __name__ == "__main__":
    main()
