"""Selection never depends on declaration order: a property over random declaration sets."""

from __future__ import annotations

import contextlib

from dispatch_kit import INTERFACE, call, kernel, make_op
from hypothesis import given, settings
from hypothesis import strategies as st

from tileops import KernelDeclarationError, TileOpsError
from tileops.testing import simulate_device

CALLS = [(device, n) for device in ("cpu", "cuda:0", "cuda:1") for n in (1, 2)]
ARCH = {"cpu": None, "cuda:0": 80, "cuda:1": 90}


@st.composite
def declaration_sets(draw):
    """Keys with random devices, archs, refusals and general flags; preferences are acyclic."""
    keys = draw(
        st.lists(st.text("abcdef", min_size=1, max_size=2), min_size=2, max_size=6, unique=True)
    )
    rank = draw(st.permutations(keys))  # preferred_over only points down this ranking
    generals = draw(st.sets(st.sampled_from(keys), max_size=2))  # two make the op invalid
    declarations = {}
    for key in keys:
        general = key in generals
        below = rank[rank.index(key) + 1 :]
        declarations[key] = {
            "devices": draw(st.frozensets(st.sampled_from(["cpu", "cuda"]), min_size=1)),
            "supported_archs": draw(
                st.none() | st.frozensets(st.sampled_from([80, 90]), min_size=1)
            ),
            "refused": draw(st.frozensets(st.sampled_from([1, 2]))),
            "general": general,
            "preferred_over": frozenset(
                () if general or not below else draw(st.sets(st.sampled_from(below)))
            ),
        }
    return declarations


def outcomes(declarations, creation_order, table_order):
    """Every call's key (or error type and message) for kernels created in `creation_order`."""
    classes = {}
    for key in creation_order:
        decl = dict(declarations[key])
        refused = decl.pop("refused")
        classes[key] = kernel(
            f"K{key}", refuse=lambda c, r=refused: "refused" if c.n in r else None, **decl
        )
    try:
        op = make_op({key: classes[key] for key in table_order}, name="ShuffledOp")()
    except KernelDeclarationError as exc:
        return "invalid", str(exc)
    results = []
    for device, n in CALLS:
        try:
            results.append(op.key_for(INTERFACE, call(device, n)))
        except TileOpsError as exc:
            results.append((type(exc).__name__, str(exc)))
        results.append(op.explain(INTERFACE, call(device, n)).text)
    return results


def expected(declarations, device, n):
    """The spec's selection, written independently: the winning key or the error's name."""
    dtype, arch = device.partition(":")[0], ARCH[device]
    if not any(dtype in d["devices"] for d in declarations.values()):
        return "OpNotAvailableError"
    left = [
        k
        for k, d in declarations.items()
        if dtype in d["devices"]
        and n not in d["refused"]
        and (d["supported_archs"] is None or arch in d["supported_archs"])
    ]
    left = [k for k in left if not declarations[k]["general"]] or left

    def beats(a, b, seen=()):
        return any(
            o == b or (o not in seen and beats(o, b, (*seen, o)))
            for o in declarations[a]["preferred_over"]
        )

    top = [k for k in left if not any(beats(o, k) for o in left)]
    if len(top) == 1:
        return top[0]
    return "AmbiguousDispatchError" if top else "NoImplementationError"


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(declarations=declaration_sets(), data=st.data())
def test_shuffled_declarations_select_identically(declarations, data):
    keys = list(declarations)
    orders = [
        (data.draw(st.permutations(keys)), data.draw(st.permutations(keys))) for _ in range(2)
    ]
    with contextlib.ExitStack() as stack:
        for device, arch in ARCH.items():
            if arch:
                stack.enter_context(simulate_device(device, arch=arch, sm_count=100))
        first, second = (outcomes(declarations, *order) for order in orders)
    assert first == second
    if first[0] == "invalid":
        assert sum(d["general"] for d in declarations.values()) > 1
        return
    for (device, n), got in zip(CALLS, first[::2], strict=True):
        assert (got if isinstance(got, str) else got[0]) == expected(declarations, device, n)
