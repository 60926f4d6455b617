"""What installing the example backend does: its kernel serves the calls it accepts and nothing
else changes; its target serves only op instances that opt in."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import Sites

README = Path(__file__).resolve().parents[2] / "examples" / "acme-backend" / "README.md"


def test_acme_kernel_serves_the_calls_it_accepts_and_explain_names_it(sites: Sites) -> None:
    result = sites.python(
        """
        import torch
        from tileops.ops import RMSNormCall, RMSNormFwdOp

        def call(**changes):
            fields = dict(device=torch.device("cpu"), n=64, eps=1e-6, dtype=torch.float32,
                          has_weight=True)
            return RMSNormCall(**{**fields, **changes})

        op = RMSNormFwdOp(64, eps=1e-6)
        others = {"float16": call(dtype=torch.float16), "n=60": call(n=60),
                  "no weight": call(has_weight=False)}
        x, w = torch.randn(4, 64), torch.randn(64)
        emit(
            served=op.key_for("rms_norm", call()),
            others={name: op.key_for("rms_norm", c) for name, c in others.items()},
            chosen=op.explain("rms_norm", call()).text,
            refused=op.explain("rms_norm", call(n=60)).text,
            close=torch.allclose(op(x, w), torch.nn.functional.rms_norm(x, (64,), w, 1e-6),
                                 atol=1e-5),
        )
        """,
        dists=["acme"],
    )
    assert result["served"] == "acme"
    assert result["others"] == {
        "float16": "reference",
        "n=60": "reference",
        "no weight": "reference",
    }
    assert "acme [acme-backend, entry point 'acme']: chosen" in result["chosen"]
    assert (
        "acme [acme-backend, entry point 'acme']: refused: acme sums rows in blocks of 8; n=60"
        in result["refused"]
    )
    assert result["close"]


# Every catalogue op over its sample cases, recording which key served each kernel_for call.
SELECTIONS = """
import torch
import tileops.ops as catalogue
from tileops import Op

served = []
kernel_for = Op.kernel_for

def spy(self, interface, call):
    served.append(self.key_for(interface, call))
    return kernel_for(self, interface, call)

Op.kernel_for = spy
rows = []
for name in sorted(catalogue.__all__):
    op_cls = getattr(catalogue, name)
    if not (isinstance(op_cls, type) and issubclass(op_cls, Op)):
        continue
    for index, case in enumerate(op_cls.sample_cases()):
        for dtype in (torch.float32, torch.bfloat16):
            served.clear()
            op = op_cls(**case.params)
            op(*[t.to(dtype) if t is not None and t.is_floating_point() else t
                 for t in case.inputs])  # lengths and offsets stay integers
            rows.append([name, index, str(dtype), op.settled_target, list(served)])
emit(rows=rows)
"""


def test_installing_acme_changes_no_selection_but_the_calls_its_kernel_serves(
    sites: Sites,
) -> None:
    before = {tuple(r[:3]): r[3:] for r in sites.python(SELECTIONS)["rows"]}
    after = {tuple(r[:3]): r[3:] for r in sites.python(SELECTIONS, dists=["acme"])["rows"]}
    assert before.keys() == after.keys()
    assert all(target == "builtin" for target, _ in [*before.values(), *after.values()])
    changed = {row for row in before if before[row] != after[row]}
    assert changed, "acme's kernel served none of RMSNormFwdOp's float32 sample calls"
    assert {(op, dtype) for op, _, dtype in changed} == {("RMSNormFwdOp", "torch.float32")}
    assert all(set(after[row][1]) == {"acme"} for row in changed)


def test_target_acme_serves_only_op_instances_that_opt_in(sites: Sites) -> None:
    result = sites.python(
        """
        import torch
        from tileops import BUILTIN, OpNotAvailableError
        from tileops.backend import set_default_target
        from tileops.ops import RMSNormFwdOp, SoftmaxFwdOp

        x = torch.randn(4, 6, 5)
        plain = SoftmaxFwdOp(dim=1)
        plain(x)
        opted = SoftmaxFwdOp(dim=1, target="acme")
        y = opted(x.transpose(0, 2))
        set_default_target("acme")
        by_default, forced = SoftmaxFwdOp(dim=1), SoftmaxFwdOp(dim=1, target=BUILTIN)
        by_default(x)
        forced(x)
        try:
            RMSNormFwdOp(5)(torch.randn(2, 5))
            error = None
        except OpNotAvailableError as exc:
            error = str(exc)
        emit(
            settled=[op.settled_target for op in (plain, opted, by_default, forced)],
            close=torch.allclose(y, torch.softmax(x.transpose(0, 2), 1)),
            error=error,
        )
        """,
        dists=["acme"],
    )
    assert result["settled"] == ["builtin", "acme", "acme", "builtin"]
    assert result["close"]
    assert (
        "settled on target 'acme' (acme-backend, entry point 'acme'), which registered no kernel "
        "builder for tileops::RMSNormFwdOp: it is the process default, set by module __main__"
    ) in result["error"]
    assert "construct the op with target=BUILTIN" in result["error"]
    assert "tileops.backend.set_default_target(...)" in result["error"]


def test_the_readme_example_runs_and_its_explain_output_is_current(sites: Sites) -> None:
    readme = README.read_text()
    example = re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0]
    sites.python(example + "\nemit(ran=True)", dists=["acme"])
    args = "explain RMSNormFwdOp --shape 4,64 --dtype float16 --param eps=1e-6".split()
    explained = sites.cli(*args, dists=["acme"]).stdout
    assert explained.strip() in readme
