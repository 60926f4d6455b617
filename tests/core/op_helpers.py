"""Helpers shared by the op-catalogue tests (test_ops_*.py): inputs, tolerances, spies."""

from __future__ import annotations

import torch
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

from tileops import Kernel, Op
from tileops.backend import register_kernel_type
from tileops.ops import GemmInterface

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
DTYPE_IDS = [str(d).removeprefix("torch.") for d in DTYPES]

# Both sides compute in float32 and round once, so 16-bit results differ by about an ulp;
# float64 is tight enough that a float32 computation would fail it.
TOLERANCES = {
    torch.float64: {"rtol": 1e-12, "atol": 1e-12},
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1.6e-2},
}


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype)


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as `t` in a non-contiguous tensor (every other element of a buffer)."""
    out = torch.empty((*t.shape, 2), dtype=t.dtype, device=t.device)[..., 0]
    out.copy_(t)
    assert t.numel() <= 1 or not out.is_contiguous()
    return out


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, **tolerance: float) -> None:
    """Same shape, dtype and device; values within the dtype's tolerance; NaNs where torch's."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert actual.device == expected.device
    torch.testing.assert_close(
        actual, expected, equal_nan=True, **(tolerance or TOLERANCES[expected.dtype])
    )


def forbid_kernels(monkeypatch, op: Op) -> None:
    """Make any kernel lookup of `op` fail: the call must be answered without a kernel."""

    def kernel_for(interface, call):
        raise AssertionError(f"a kernel was requested for {call!r}")

    monkeypatch.setattr(op, "kernel_for", kernel_for)


def assert_reference_chosen(op: Op, interface: str, call, key: str = "reference") -> None:
    explanation = op.explain(interface, call)
    assert explanation.chosen == key and explanation.error is None
    assert explanation.verdict(key) == "chosen"
    text = str(explanation)
    assert f"{key} [tileops-core]: chosen: the only available implementation" in text
    assert f"=> {key} (chosen)" in text


def install_spy(op_cls: type[Op], interface: str, log: list) -> None:
    """Register (inside an isolated registry) a CPU kernel that beats the reference on
    `interface`, records the arguments the op hands it, and computes with the reference."""
    contract = op_cls.interfaces[interface]
    general = next(c for c in op_cls.kernel_types.values() if issubclass(c, contract))

    class Spy(Kernel, contract):
        devices = {"cpu"}

        def __init__(self, inner) -> None:
            self.inner = inner

        @classmethod
        def entry_for(cls, call):
            identity, build = general.entry_for(call)
            return identity, lambda: cls(build())

        def forward(self, *args, **kwargs):
            log.append(args)
            return self.inner(*args)

    register_kernel_type(op_cls, "spy", Spy)


def assert_trains_as_eager(
    eager: torch.nn.Module,
    x: torch.Tensor,
    labels: torch.Tensor,
    *,
    swapped: int,
    autocast: torch.dtype | None = None,
    lr: float = 0.1,
    tolerance: float = 1e-5,
) -> None:
    """Kernelize a copy of `eager` (`swapped` modules), train both with SGD for three steps on
    (x, labels), under CPU autocast to `autocast` when given: the losses and the final states
    agree within `tolerance` (the states within 2.5x that)."""
    import copy

    import torch.nn.functional as F

    import tileops.nn as tnn

    ours = copy.deepcopy(eager)
    assert len(tnn.kernelize(ours).swapped) == swapped
    optims = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for m in (eager, ours)]
    for _ in range(3):
        losses = []
        for model, optim in zip((eager, ours), optims, strict=True):
            optim.zero_grad()
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=bool(autocast)):
                logits = model(x)
            assert logits.dtype == (autocast or x.dtype)
            loss = F.cross_entropy(logits.float(), labels)
            loss.backward()
            optim.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=tolerance, atol=tolerance)
    state = {"rtol": 2.5 * tolerance, "atol": 2.5 * tolerance}
    torch.testing.assert_close(ours.state_dict(), eager.state_dict(), **state)


class Doubling(Kernel, GemmInterface):
    """A CPU GEMM kernel (preferred over the reference, not torch's own) returning
    2(ab + bias), which checks that it gets the layout the interface promises."""

    devices = {"cpu"}
    served: list = []

    @classmethod
    def entry_for(cls, call):
        layout = call.trans_a, call.trans_b
        return layout, lambda: cls(*layout)

    def __init__(self, trans_a, trans_b):
        self.trans_a, self.trans_b = trans_a, trans_b

    def forward(self, a, b, bias):
        assert a.is_contiguous() and b.is_contiguous(), "the interface promises contiguous"
        Doubling.served.append(a.shape)
        product = (a.t() if self.trans_a else a) @ (b.t() if self.trans_b else b)
        return 2 * (product if bias is None else product + bias)


class Capture:
    """A torch.compile backend keeping the aten ops of every forward and backward graph."""

    def __init__(self) -> None:
        self.graphs: list[list[str]] = []

    def __call__(self, gm: torch.fx.GraphModule, inputs: list) -> object:
        def keep(graph: torch.fx.GraphModule, _: list) -> object:
            ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
            self.graphs.append(ops)
            return make_boxed_func(graph)

        return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep)

    def ops(self) -> set[str]:
        return {op for graph in self.graphs for op in graph}

    def tileops(self) -> set[str]:
        return {op for op in self.ops() if op.startswith("tileops.")}
