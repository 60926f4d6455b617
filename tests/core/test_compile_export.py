"""Ops and tileops.nn modules under torch.compile and torch.export, as models use them: ops
built inside compiled functions, whole training steps compiled fullgraph, every module exported
with a dynamic batch dimension."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from op_helpers import randn
from torch import nn

import tileops
import tileops.nn as tnn
from tileops import CallSpec, Input, Kernel, KernelInterface, Op, Output, Signature


def _built_inside(x, w):
    """Every op of the catalogue, constructed in the traced function itself."""
    y = tileops.RMSNormFwdOp(8)(x, w)
    y = tileops.LayerNormFwdOp(8, eps=1e-6)(y, w, None)
    y = tileops.SoftmaxFwdOp(-1)(y)
    y = tileops.GemmOp()(y, torch.eye(8) * w)
    return tileops.BatchNormFwdOp(4, training=True)(y.view(-1, 4, 8), None, None, None, None)


def _reference(x, w):
    y = F.layer_norm(F.rms_norm(x, (8,), w), (8,), w, eps=1e-6)
    y = torch.softmax(y, -1) @ (torch.eye(8) * w)
    return F.batch_norm(y.view(-1, 4, 8), None, None, training=True)


def test_ops_built_inside_a_compiled_function_compile_fullgraph():
    x, w = randn(8, 8), randn(8, seed=1)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_built_inside)(x, w)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    compiled = torch.compile(_built_inside, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, w), _reference(x, w))


def test_an_op_built_while_traced_works_eagerly_afterwards():
    """Its dispatch state (tables, locks) is attached on its first eager use."""

    def build(x):
        op = tileops.RMSNormFwdOp(8)
        return op(x, None), op

    x = randn(3, 8)
    out, op = torch.compile(build, fullgraph=True, backend="eager")(x)
    torch.testing.assert_close(op(x, None), out)
    assert op.settled_target == "builtin"


class _TimesCall(CallSpec):
    dtype: torch.dtype


class _Times(KernelInterface):
    def forward(self, x): ...


class _TorchTimes(Kernel, _Times):
    devices = {"cpu"}
    general = True

    def __init__(self):
        self.factor = 3.0

    def forward(self, x):
        return x * self.factor


def test_an_op_class_first_used_inside_a_compiled_function_defines_its_operator(
    tileops_registry,
):
    """The operator is defined at trace time, without Dynamo tracing the definition's lock."""

    class TimesThreeOp(Op):
        namespace = "tests.compile_first_use"
        interfaces = {"times": _Times}
        kernel_types = {"torch": _TorchTimes}
        signature = Signature((Input("x", ("n",)),), {}, (Output("out", like="x"),))

        def forward(self, x):
            return self.call_kernel(
                "times", _TimesCall(device=x.device, dtype=x.dtype), x.shape, x.dtype, x
            )

        def reference_forward(self, x):
            return x * 3.0

    x = randn(5)
    compiled = torch.compile(lambda x: TimesThreeOp()(x) + 1, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), x * 3 + 1)


def test_ops_built_or_pinned_inside_a_function_compiled_with_graph_breaks_do_not_deadlock():
    """Dynamo re-sets torch's determinism flag around each frame it compiles, some of them
    run while tileops holds a lock: only a real flip may re-point the caches, and an op built
    while traced attaches nothing. In a subprocess: a deadlock fails, never hangs the suite."""
    script = textwrap.dedent(
        """
        import torch, tileops
        op = tileops.SoftmaxFwdOp(-1)

        def f(x):
            with tileops.pinned(tileops.SoftmaxFwdOp, "softmax", "reference"):
                return op(x) * 2

        def g(x):
            y = tileops.RMSNormFwdOp(8)(x, None)
            torch._dynamo.graph_break()
            return tileops.SoftmaxFwdOp(-1)(y)

        x = torch.randn(4, 8)
        torch.testing.assert_close(torch.compile(f, backend="eager")(x), torch.softmax(x, -1) * 2)
        want = torch.softmax(torch.nn.functional.rms_norm(x, (8,)), -1)
        torch.testing.assert_close(torch.compile(g, backend="eager")(x), want)
        torch.use_deterministic_algorithms(True)  # a real flip still re-points them
        torch.testing.assert_close(op(x), torch.softmax(x, -1))
        print("done")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-2000:]


def _model() -> nn.Sequential:
    return nn.Sequential(
        tnn.Linear(8, 16),
        tnn.LayerNorm(16),
        nn.ReLU(inplace=True),
        nn.Unflatten(1, (4, 4)),
        tnn.BatchNorm1d(4),
        nn.Flatten(),
        tnn.RMSNorm(16),
        tnn.Linear(16, 5),
        tnn.Softmax(dim=-1),
    )


def test_a_training_step_of_tileops_modules_compiles_fullgraph_as_eager():
    torch.manual_seed(0)
    eager = _model()
    compiled_model = _model()
    compiled_model.load_state_dict(eager.state_dict())
    x = randn(6, 8)

    def step(model, x):
        loss = (model(x) * torch.arange(5.0)).sum()
        loss.backward()  # through the compiled graph's backward, for the compiled model
        return loss

    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        torch.testing.assert_close(step(compiled, x), step(eager, x))
    grads = {n: p.grad for n, p in compiled_model.named_parameters()}
    torch.testing.assert_close(grads, {n: p.grad for n, p in eager.named_parameters()})
    torch.testing.assert_close(compiled_model.state_dict(), eager.state_dict())


# name: (module factory, example input shape); each exported with a dynamic batch dimension
MODULES = {
    "Linear": (lambda: tnn.Linear(8, 6), (4, 8)),
    "Linear_3d": (lambda: tnn.Linear(8, 6), (4, 3, 8)),
    "LayerNorm": (lambda: tnn.LayerNorm(8), (4, 3, 8)),
    "RMSNorm": (lambda: tnn.RMSNorm(8), (4, 8)),
    "Softmax": (lambda: tnn.Softmax(dim=-1), (4, 8)),
    "BatchNorm1d": (lambda: tnn.BatchNorm1d(8), (4, 8)),
    "BatchNorm2d": (lambda: tnn.BatchNorm2d(3), (4, 3, 5, 5)),
    "BatchNorm3d": (lambda: tnn.BatchNorm3d(3), (4, 3, 2, 2, 2)),
}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(MODULES))
def test_every_module_exports_with_a_dynamic_batch(name, training):
    make, shape = MODULES[name]
    torch.manual_seed(0)
    module = make().train(training)
    twin = make().train(training)
    twin.load_state_dict(module.state_dict())
    batch = torch.export.Dim("batch", min=2, max=1024)
    program = torch.export.export(module, (randn(*shape),), dynamic_shapes=({0: batch},))
    exported = program.module()
    for rows in (2, 7, 33):
        x = randn(rows, *shape[1:], seed=rows)
        torch.testing.assert_close(exported(x), twin(x))


class _BuildsOps(nn.Module):
    def forward(self, x):
        return _built_inside(x, torch.ones(8)).flatten(0, 1)


def test_a_module_building_ops_in_forward_exports_with_a_dynamic_batch():
    batch = torch.export.Dim("batch", min=1, max=512)
    program = torch.export.export(_BuildsOps(), (randn(8, 8),), dynamic_shapes=({0: 4 * batch},))
    x = randn(12, 8, seed=5)
    torch.testing.assert_close(program.module()(x), _reference(x, torch.ones(8)).flatten(0, 1))
