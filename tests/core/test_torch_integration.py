"""tileops inside PyTorch's stack: torch.library operators, torch.compile, export, autograd,
mixed precision and autocast, on the CPU."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tileops
from tileops import Kernel, library
from tileops.backend import register_kernel_type
from tileops.ops import SoftmaxInterface


def randn(*shape: int, dtype: torch.dtype = torch.float32, grad: bool = False) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype).requires_grad_(grad)


def cases(grad: bool = False, dtype: torch.dtype = torch.float32):
    """(op factory, inputs, the torch function it matches) for every op of the catalogue."""

    def t(*shape):
        return randn(*shape, dtype=dtype, grad=grad)

    def stats():
        return torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)

    return {
        "rms_norm": (
            lambda: tileops.RMSNormFwdOp(8),
            (t(4, 8), t(8)),
            lambda x, w: F.rms_norm(x, (8,), w),
        ),
        "layer_norm": (
            lambda: tileops.LayerNormFwdOp((2, 8)),
            (t(3, 2, 8), t(2, 8), t(2, 8)),
            lambda x, w, b: F.layer_norm(x, (2, 8), w, b),
        ),
        "softmax": (
            lambda: tileops.SoftmaxFwdOp(dim=1),
            (t(4, 6, 3),),
            lambda x: torch.softmax(x, 1),
        ),
        "gemm": (lambda: tileops.GemmOp(), (t(5, 8), t(8, 3)), lambda a, b: a @ b),
        "gemm_nt_bias": (
            lambda: tileops.GemmOp(trans_b=True),
            (t(5, 8), t(3, 8), t(3)),
            lambda a, b, bias: F.linear(a, b, bias),
        ),
        "gemm_tt": (lambda: tileops.GemmOp(True, True), (t(8, 5), t(3, 8)), lambda a, b: a.T @ b.T),
        "batch_norm_train": (
            lambda: tileops.BatchNormFwdOp(3),
            (t(4, 3, 5), t(3), t(3), *stats()),
            lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, True),
        ),
        "batch_norm_infer": (
            lambda: tileops.BatchNormFwdOp(3, training=False),
            (t(4, 3, 5), t(3), t(3), *stats()),
            lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, False),
        ),
    }


NAMES = list(cases())


@pytest.mark.parametrize("name", NAMES)
def test_every_op_is_a_torch_library_operator_that_opcheck_accepts(name):
    make, inputs, _ = cases(grad=True)[name]
    op = make()
    operator = library.operator(type(op)).default
    assert str(operator).startswith(f"tileops.{type(op).__name__}")
    padded = (*inputs, *[None] * (len(op.signature.inputs) - len(inputs)))  # absent optionals
    torch.library.opcheck(operator, (*padded, *op.params().values()))


@pytest.mark.parametrize("name", NAMES)
def test_every_op_compiles_fullgraph_on_a_fresh_instance_without_graph_breaks(name):
    make, inputs, reference = cases()[name]
    op = make()  # fresh: never called, so never settled

    def model(*args):
        return op(*args) * 2

    explanation = torch._dynamo.explain(model)(*inputs)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    expected = reference(*[t.clone() for t in inputs]) * 2
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*inputs), expected)


def test_dynamic_shapes_compile_once():
    op = tileops.RMSNormFwdOp(16)
    compiled = torch.compile(lambda x, w: op(x, w) + 1, fullgraph=True, dynamic=True)
    w = randn(16)
    torch._dynamo.utils.counters.clear()
    for rows in (3, 7, 64, 129):
        x = randn(rows, 16)
        torch.testing.assert_close(compiled(x, w), F.rms_norm(x, (16,), w) + 1)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


class NumpySoftmax(Kernel, SoftmaxInterface):
    """An opaque kernel Dynamo cannot trace: numpy inside."""

    devices = {"cpu"}

    def forward(self, x):
        rows = x.detach().numpy()
        e = np.exp(rows - rows.max(axis=-1, keepdims=True))
        return torch.from_numpy(e / e.sum(axis=-1, keepdims=True)).to(x.dtype).contiguous()


def test_an_opaque_kernel_compiles_fullgraph_with_correct_values_and_gradients(tileops_registry):
    register_kernel_type(tileops.SoftmaxFwdOp, "numpy", NumpySoftmax)
    op = tileops.SoftmaxFwdOp(dim=-1)
    x = randn(4, 8, grad=True)
    compiled = torch.compile(lambda x: (op(x) * torch.arange(8.0)).sum(), fullgraph=True)
    compiled(x).backward()
    x_ref = x.detach().clone().requires_grad_()
    (torch.softmax(x_ref, -1) * torch.arange(8.0)).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    call = tileops.ops.SoftmaxCall(device=x.device, n=8, dtype=x.dtype)
    assert op.key_for("softmax", call) == "numpy"


EXPORT = """
import sys, torch, tileops
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = tileops.RMSNormFwdOp(8)
        self.weight = torch.nn.Parameter(torch.randn(8))
    def forward(self, x):
        return torch.softmax(self.norm(x, self.weight), -1)
torch.manual_seed(0)
block, x = Block(), torch.randn(3, 8)
program = torch.export.export(block, (x,))
nodes = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
assert nodes.count("tileops.RMSNormFwdOp.default") == 1, nodes
torch.export.save(program, sys.argv[1])
torch.save((x, block(x)), sys.argv[1] + ".expected")
"""

LOAD = """
import sys, torch, tileops
program = torch.export.load(sys.argv[1])
x, expected = torch.load(sys.argv[1] + ".expected")
torch.testing.assert_close(program.module()(x), expected)
print("loaded")
"""


def test_an_exported_program_holds_one_tileops_node_and_runs_after_load(tmp_path):
    path = str(tmp_path / "block.pt2")
    for script in (EXPORT, LOAD):  # load in a fresh process, as users do
        done = subprocess.run(
            [sys.executable, "-c", script, path], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded"


@pytest.mark.parametrize("name", NAMES)
def test_gradients_flow_through_the_operator_and_match_torch(name):
    make, inputs, reference = cases(grad=True, dtype=torch.float64)[name]
    ref_inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = make()(*inputs)
    expected = reference(*ref_inputs)
    torch.testing.assert_close(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for got, want in zip(inputs, ref_inputs, strict=True):
        if want.requires_grad:
            torch.testing.assert_close(got.grad, want.grad)
    if name.startswith("batch_norm"):  # running stats updated exactly once, as torch does
        torch.testing.assert_close(inputs[3], ref_inputs[3])


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_in_float64(name):
    make, inputs, _ = cases(grad=True, dtype=torch.float64)[name]
    op = make()
    grads = [t for t in inputs if t.requires_grad]
    rest = {k: t for k, t in enumerate(inputs) if not t.requires_grad}

    def f(*differentiable):
        it = iter(differentiable)
        return op(*[rest[k].clone() if k in rest else next(it) for k in range(len(inputs))])

    assert torch.autograd.gradcheck(f, grads)


def test_a_backend_can_register_a_backward_kernel(tileops_registry):
    from tileops.ops import BackwardInterface

    seen = []

    class DoubledBackward(Kernel, BackwardInterface):
        devices = {"cpu"}

        def forward(self, grads, inputs):
            seen.append(len(inputs))
            return (2 * grads[0] @ inputs[1].T, None, None)

    register_kernel_type(tileops.GemmOp, "doubled_backward", DoubledBackward)
    a, b = randn(2, 3, grad=True), randn(3, 4)
    tileops.GemmOp()(a, b).backward(torch.ones(2, 4))
    assert seen == [3]  # a, b and the absent bias
    torch.testing.assert_close(a.grad, 2 * torch.ones(2, 4) @ b.T)


def _gemm_backward(differentiable: bool, seen: list) -> type:
    """A GEMM backward kernel for a; detached (numpy-like) unless it declares differentiable."""
    from tileops.ops import BackwardInterface

    class GemmBackward(Kernel, BackwardInterface):
        devices = {"cpu"}

        @classmethod
        def refusal(cls, call):  # the second-order graph holds the NT GEMM of GemmOp's backward
            return None if not any(v for _, v in call.params) else "NN only"

        def forward(self, grads, inputs):
            seen.append(self.differentiable)
            grad_a = grads[0] @ inputs[1].T
            return (grad_a if self.differentiable else grad_a.detach(), None, None)

    GemmBackward.differentiable = differentiable
    return GemmBackward


def _second_derivative_of_gemm(op):
    """d/da of sum(d/da sum((a @ b)**2)): torch's value, and ours through `op`."""
    a, b = randn(2, 3, dtype=torch.float64), randn(3, 4, dtype=torch.float64)
    values = []
    for fn in (op, torch.mm):
        leaf = a.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(leaf, b).pow(2).sum(), leaf, create_graph=True)
        values.append(torch.autograd.grad(g.sum(), leaf)[0])
    return values


def test_a_backward_kernel_that_is_not_differentiable_refuses_double_backward(tileops_registry):
    from tileops.ops import BackwardCall

    seen = []
    register_kernel_type(tileops.GemmOp, "detached_backward", _gemm_backward(False, seen))
    op = tileops.GemmOp()
    got, want = _second_derivative_of_gemm(op)
    torch.testing.assert_close(got, want)
    assert seen == [False]  # the reference served the create_graph backward, this the next one
    call = BackwardCall(
        device=torch.device("cpu"),
        op=op.op_name,
        params=(),
        dtypes=(torch.float64, torch.float64),
        needs=(True, False),
        create_graph=True,
    )
    explanation = op.explain("backward", call)
    assert explanation.chosen == "reference_backward"
    assert explanation.verdict("detached_backward") == "refused"
    assert "runs under create_graph (double backward), and the kernel does not declare " in str(
        explanation
    )
    with tileops.pinned(tileops.GemmOp, "backward", "detached_backward"):
        with pytest.raises(tileops.NoImplementationError, match="differentiable = True"):
            _second_derivative_of_gemm(op)


def test_a_differentiable_backward_kernel_serves_double_backward(tileops_registry):
    seen = []
    register_kernel_type(tileops.GemmOp, "graph_backward", _gemm_backward(True, seen))
    got, want = _second_derivative_of_gemm(tileops.GemmOp())
    torch.testing.assert_close(got, want)
    assert seen == [True, True]  # the create_graph backward, then the first-order one


def test_differentiable_must_be_a_bool():
    from tileops.ops import BackwardInterface

    with pytest.raises(tileops.KernelDeclarationError, match="differentiable must be True or"):

        class Sloppy(Kernel, BackwardInterface):
            differentiable = "yes"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_mixed_precision_norms_match_torch(name, dtype):
    make, inputs, reference = cases()[name]
    x, *params = inputs
    x = x.to(dtype)  # float32 parameters beside a 16-bit input, as under autocast
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on its own mixed path; ours must not
        out = make()(x, *params)
    expected = reference(x, *params)
    assert out.dtype == expected.dtype == dtype
    torch.testing.assert_close(out, expected)


def test_mixed_precision_is_in_the_call_spec_and_float32_params_need_a_16_bit_input():
    op = tileops.LayerNormFwdOp(8)
    x, w = randn(2, 8, dtype=torch.bfloat16), randn(8)
    assert op.call_for(x, w, w).param_dtype == torch.float32
    assert op.call_for(x.float(), w, None).param_dtype == torch.float32
    with pytest.raises(tileops.OpInputError, match="argument 'weight' has dtype float32"):
        op(x.double(), w, None)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_under_autocast_each_op_behaves_as_its_torch_counterpart(name, dtype):
    make, inputs, reference = cases(dtype=dtype)[name]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = make()(*[t.clone() for t in inputs])
        expected = reference(*[t.clone() for t in inputs])
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)


@pytest.fixture
def fresh_probes(monkeypatch):
    """No autocast policy probed yet: the first call under autocast is the one that probes."""
    monkeypatch.setattr(tileops.autocast, "_policies", {})


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.bfloat16),
        (torch.float16, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_under_autocast_gemm_casts_mixed_operands_as_torch_mm(fresh_probes, a_dtype, b_dtype):
    a, b = randn(5, 8, dtype=a_dtype), randn(8, 3, dtype=b_dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tileops.GemmOp()(a, b)
        expected = torch.mm(a, b)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "batch_norm_train", "batch_norm_infer"])
def test_under_autocast_norms_take_16_bit_x_beside_float32_params(fresh_probes, name):
    """Autocast's own layout: float32 parameters (and running stats) beside a 16-bit x."""
    make, (x, *params), reference = cases()[name]
    x, theirs = x.to(torch.bfloat16), [t.clone() for t in params]
    with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's rms_norm warns on its own mixed path
        out, expected = make()(x, *params), reference(x, *theirs)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(params, theirs)  # running stats updated as torch updates them


def _stats():
    return torch.zeros(3), torch.ones(3)


# name: (op factory, a bad call's inputs, a good call's inputs, the op's error)
BAD_CALLS = {
    "softmax_dim": (
        lambda: tileops.SoftmaxFwdOp(5),
        (randn(2, 3),),
        (randn(2, 3, 4, 5, 6, 7),),
        "dim 5 is out of range",
    ),
    "inference_without_stats": (
        lambda: tileops.BatchNormFwdOp(3, training=False),
        (randn(2, 3, 4), None, None, None, None),
        (randn(2, 3, 4), None, None, *_stats()),
        "argument 'running_mean' is required in inference",
    ),
    "one_running_stat": (
        lambda: tileops.BatchNormFwdOp(3),
        (randn(2, 3, 4), None, None, torch.zeros(3), None),
        (randn(2, 3, 4), None, None, *_stats()),
        "argument 'running_var' is missing while 'running_mean' is given",
    ),
    "gemm_shapes": (
        tileops.GemmOp,
        (randn(2, 3), randn(4, 4)),
        (randn(2, 3), randn(3, 4)),
        r"argument 'b' has shape \[4, 4\], expected \[3, n\]",
    ),
    "gemm_float64_beside_float32": (
        tileops.GemmOp,
        (randn(2, 3, dtype=torch.float64), randn(3, 4)),
        (randn(2, 3, dtype=torch.float64), randn(3, 4, dtype=torch.float64)),
        "argument 'b' has dtype float32, expected float64",
    ),
    "not_a_tensor": (
        lambda: tileops.LayerNormFwdOp(3),
        ([1.0, 2.0, 3.0], None, None),
        (randn(2, 3), None, None),
        "argument 'x' must be a torch.Tensor, got list",
    ),
}


@pytest.mark.parametrize("good_call_first", [False, True], ids=["bad_first", "good_first"])
@pytest.mark.parametrize("name", BAD_CALLS)
def test_under_autocast_bad_calls_raise_the_ops_own_errors(fresh_probes, name, good_call_first):
    """The op's checks run before autocast probes its torch definition, whatever ran before."""
    make, bad, good, match = BAD_CALLS[name]
    with pytest.raises(tileops.OpInputError, match=match) as without:
        make()(*bad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if good_call_first:  # the op class probed, for these dtypes where the call allows it
            make()(*good)
        with pytest.raises(tileops.OpInputError, match=match) as under:
            make()(*bad)
    assert str(under.value) == str(without.value)


def test_under_autocast_a_dtype_the_cast_leaves_disagreeing_names_the_cast(tileops_registry):
    """An input autocast does not cast (one the op writes) may disagree after the cast."""
    from tileops import CallSpec, Input, KernelInterface, Op, Output, Signature

    class SummedCall(CallSpec):
        dtype: torch.dtype

    class Summed(KernelInterface):
        def forward(self, a, b, total): ...

    class TorchSummed(Kernel, Summed):
        devices = {"cpu"}
        general = True

        def forward(self, a, b, total):
            out = torch.mm(a, b)
            total.add_(out.sum())
            return out

    class SummedGemmOp(Op):
        """a @ b, its sum added to `total` in place."""

        namespace = "tests.autocast"
        interfaces = {"summed": Summed}
        kernel_types = {"torch": TorchSummed}
        signature = Signature(
            (
                Input("a", ("m", "k")),
                Input("b", ("k", "n"), dtypes=("a",)),
                Input("total", (), dtypes=("a",), written=True),
            ),
            {},
            (Output("out", shape=("m", "n"), dtype_of="a"),),
        )

        def forward(self, a, b, total):
            call = SummedCall(device=a.device, dtype=a.dtype)
            shape = (a.shape[0], b.shape[1])
            return self.call_kernel("summed", call, shape, a.dtype, a, b, total)

        def reference_forward(self, a, b, total):
            out = torch.mm(a, b)
            total.add_(out.sum())
            return out

    a, b, total = randn(2, 3), randn(3, 4), torch.zeros(())
    torch.testing.assert_close(SummedGemmOp()(a, b, total), a @ b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(tileops.OpInputError, match="argument 'total' has dtype float32") as e:
            SummedGemmOp()(a, b, total)
    assert (
        "under torch.autocast('cpu') the op cast 'a' from float32 to bfloat16, 'b' from float32 "
        "to bfloat16, as autocast casts its torch counterpart's inputs"
    ) in e.value.__notes__
    torch.testing.assert_close(total, (a @ b).sum())  # written once, by the call that ran


def test_under_autocast_an_op_autocast_runs_in_float32_gets_float32_inputs(
    tileops_registry, fresh_probes
):
    """What CUDA's autocast does to layer_norm and softmax, shown on the CPU with mse_loss."""
    from tileops import CallSpec, Input, KernelInterface, Op, Output, Signature

    class SquaredErrorCall(CallSpec):
        dtype: torch.dtype

    class SquaredError(KernelInterface):
        def forward(self, x, y): ...

    class TorchSquaredError(Kernel, SquaredError):
        devices = {"cpu"}
        general = True

        def forward(self, x, y):
            return (x - y) ** 2

    class SquaredErrorOp(Op):
        namespace = "tests.autocast"
        interfaces = {"squared_error": SquaredError}
        kernel_types = {"torch": TorchSquaredError}
        signature = Signature(
            (Input("x", ("n",)), Input("y", ("n",), dtypes=("x",))), {}, (Output("out", like="x"),)
        )

        def forward(self, x, y):
            call = SquaredErrorCall(device=x.device, dtype=x.dtype)
            return self.call_kernel("squared_error", call, x.shape, x.dtype, x, y)

        def reference_forward(self, x, y):
            return F.mse_loss(x, y, reduction="none")

    bf16, f32 = torch.bfloat16, torch.float32
    for x_dtype, y_dtype in [(bf16, bf16), (bf16, f32), (f32, bf16), (f32, f32)]:
        x, y = randn(6, dtype=x_dtype), randn(6, dtype=y_dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, expected = SquaredErrorOp()(x, y), F.mse_loss(x, y, reduction="none")
        assert out.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(out, expected)


def test_tileops_nn_modules_compile_fullgraph():
    import tileops.nn as tnn

    model = torch.nn.Sequential(
        tnn.RMSNorm(16),
        tnn.Linear(16, 16),
        tnn.Softmax(dim=-1),
        tnn.LayerNorm(16),
        torch.nn.Unflatten(1, (4, 4)),
        tnn.BatchNorm1d(4),
    ).eval()
    x = randn(5, 16)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_exports_with_a_dynamic_batch(bias):
    """One graph for every batch size: no choice in tnn.Linear depends on the row count (a
    route picked on a symbolic size once failed export with "Expected op to be '=='")."""
    import tileops.nn as tnn

    model = torch.nn.Sequential(tnn.Linear(16, 8, bias=bias), torch.nn.ReLU()).eval()
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (randn(5, 3, 16),), dynamic_shapes=({0: batch},))
    nodes = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert nodes.count("tileops.GemmOp.default") == 1, nodes
    for rows in (1, 2, 64):
        x = randn(rows, 3, 16)
        torch.testing.assert_close(program.module()(x), model(x))


def test_an_op_with_untyped_params_runs_eagerly_under_autograd_and_autocast():
    """No schema types: no operator, and the op works as before (its kernels' own autograd)."""
    from tileops import CallSpec, Input, KernelInterface, Op, Output, Signature

    class DoubleCall(CallSpec):
        n: int

    class Double(KernelInterface):
        def forward(self, x): ...

    class TorchDouble(Kernel, Double):
        devices = {"cpu"}
        general = True

        def forward(self, x):
            return x * 2

    class UntypedOp(Op):
        interfaces = {"double": Double}
        kernel_types = {"torch": TorchDouble}
        signature = Signature((Input("x", ("...",)),), ("scale",), (Output("out", like="x"),))

        def __init__(self) -> None:
            self.scale = 2
            super().__init__()

        def forward(self, x):
            call = DoubleCall(device=x.device, n=x.shape[-1])
            return self.call_kernel("double", call, x.shape, x.dtype, x)

    x = randn(3, grad=True)
    UntypedOp()(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert UntypedOp()(randn(3)).dtype == torch.float32


def test_the_operators_trace_time_definition_carries_torchs_constant_result_mark():
    """library marks `_defined` as `torch.compiler.assume_constant_result` would, without
    importing torch._dynamo at `import tileops`: the mark must stay the one torch sets."""
    from tileops import library

    def probe() -> None: ...

    marked = torch.compiler.assume_constant_result(probe)
    assert vars(marked) and all(getattr(library._defined, k) == v for k, v in vars(marked).items())
