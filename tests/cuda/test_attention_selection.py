"""Which attention key serves which call, on simulated sm_80 and sm_90 devices (no GPU needed):
cuDNN over FlashAttention over the memory-efficient kernel where they overlap, each refusing
what its backend cannot take with the reason, the TileLang kernels where no vendor serves, and
no gap or ambiguity anywhere `tileops audit` probes."""

from __future__ import annotations

import pytest
import torch
from cuda_grid import SIMULATED

import tileops_cuda
from tileops.cli import main
from tileops.ops import (
    AttentionBwdOp,
    AttentionCall,
    AttentionDecodeCall,
    AttentionDecodeOp,
    AttentionFwdOp,
    AttentionVarlenBwdOp,
    AttentionVarlenCall,
    AttentionVarlenFwdOp,
)
from tileops.testing import simulate_device
from tileops_cuda.attention import kernels

BF16 = torch.bfloat16


def attention_call(
    batch=2, heads=32, kv_heads=8, q_len=4096, kv_len=4096, dim=128, v_dim=None, causal=True,
    dtype=BF16, window=None, scale=None,
) -> AttentionCall:  # fmt: skip
    scale = dim**-0.5 if scale is None else scale
    return AttentionCall(
        device=torch.device("cuda:0"), batch=batch, heads=heads, kv_heads=kv_heads, q_len=q_len,
        kv_len=kv_len, head_dim=dim, v_dim=v_dim or dim, causal=causal, scale=scale,
        dtype=dtype, window=window,
    )  # fmt: skip


def key(call: AttentionCall, arch: int = 90, op_cls=AttentionFwdOp) -> str:
    interface = "attention" if op_cls is AttentionFwdOp else "attention_bwd"
    with simulate_device("cuda:0", arch=arch, **SIMULATED[arch]):
        return op_cls().key_for(interface, call)


CHOICES = [  # (call, arch, the forward's key)
    (attention_call(), 90, "sdpa_cudnn"),  # GQA prefill, the shape
    (attention_call(causal=False, q_len=1024, kv_len=1024), 80, "sdpa_cudnn"),
    (attention_call(q_len=1, kv_len=32768, causal=False), 90, "tilelang_flash_decode"),  # decode
    (attention_call(q_len=1, kv_len=32768, dim=256), 90, "sdpa_flash"),  # beyond TileLang's dims
    (attention_call(dim=256), 90, "sdpa_flash"),  # beyond cuDNN's 128
    (attention_call(q_len=512, kv_len=4096), 90, "sdpa_flash"),  # chunked prefill: bottom right
    (attention_call(q_len=1, kv_len=1, causal=False), 80, "tilelang_flash_decode"),
    (attention_call(q_len=64, kv_len=1, causal=False), 90, "sdpa_flash"),  # cuDNN: kv_len 1
    (attention_call(dim=96, v_dim=64), 90, "sdpa_cudnn"),  # cuDNN takes two head dims
    (attention_call(dim=256, v_dim=128), 90, "sdpa_efficient"),
    (attention_call(dtype=torch.float32), 90, "sdpa_efficient"),
    (attention_call(dtype=torch.float64), 90, "reference"),
    (attention_call(dim=100, dtype=torch.float32), 90, "sdpa_efficient"),  # 4 divides 100
    (attention_call(dim=36), 90, "reference"),  # no multiple of 8
    (attention_call(scale=-0.1), 90, "reference"),  # online softmaxes need scale > 0
    (attention_call(q_len=4097, kv_len=4096), 90, "tilelang_flash_fwd_sm90"),  # keyless rows
    (attention_call(window=4096), 90, "tilelang_flash_fwd_sm90"),  # no SDPA kernel has windows
    (attention_call(window=4096), 80, "tilelang_flash_fwd"),
    (attention_call(window=4096, dim=256), 90, "reference"),  # beyond the TileLang head dims
    (attention_call(window=4096, dtype=torch.float32), 90, "reference"),
    (attention_call(q_len=1, window=4096), 90, "tilelang_flash_decode"),  # 4 rows per kv head
    (attention_call(q_len=16, window=4096), 86, "tilelang_flash_decode"),  # 64 rows
    (attention_call(q_len=17, window=4096), 86, "tilelang_flash_fwd"),  # 68 rows
]


@pytest.mark.parametrize("call, arch, expected", CHOICES)
def test_the_forward_key_for_each_call(call, arch, expected):
    assert key(call, arch) == expected


def test_decode_over_per_sequence_lengths_is_tilelang_within_its_tile():
    def decode_key(q_len: int, kv_heads: int = 8) -> str:
        call = AttentionDecodeCall(
            device=torch.device("cuda:0"), batch=4, heads=32, kv_heads=kv_heads, q_len=q_len,
            capacity=8192, head_dim=128, v_dim=128, causal=True, scale=0.1, dtype=BF16,
        )  # fmt: skip
        with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
            return AttentionDecodeOp(causal=True).key_for("attention_decode", call)

    assert decode_key(1) == decode_key(16) == "tilelang_flash_decode"
    assert decode_key(2, kv_heads=1) == "tilelang_flash_decode"  # 32 heads x 2 tokens: 64 rows
    assert decode_key(17) == decode_key(3, kv_heads=1) == "reference"  # 68 and 96 rows


@pytest.mark.parametrize(
    "block_size, q_len, expected",
    [
        (16, 1, "tilelang_paged_decode"),
        (8, 16, "tilelang_paged_decode"),
        (256, 1, "tilelang_paged_decode"),
        (4, 1, "reference_paged"),
        (24, 1, "reference_paged"),
        (16, 17, "reference_paged"),
    ],  # fmt: skip
)
def test_paged_decode_is_tilelang_for_power_of_two_blocks_within_its_tile(
    block_size, q_len, expected
):
    from tileops.ops import AttentionPagedDecodeCall

    call = AttentionPagedDecodeCall(
        device=torch.device("cuda:0"), batch=4, heads=32, kv_heads=8, q_len=q_len,
        num_blocks=4096, block_size=block_size, max_blocks=64, head_dim=128, v_dim=128,
        causal=True, scale=0.1, dtype=BF16,
    )  # fmt: skip
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        op = AttentionDecodeOp(causal=True)
        assert op.key_for("attention_paged_decode", call) == expected
        if expected == "reference_paged" and q_len == 1:
            reasons = str(op.explain("attention_paged_decode", call))
            assert f"block_size {block_size} is not served (a power of two, at least 8" in reasons


def test_deterministic_mode_leaves_cudnn_out():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert key(attention_call()) == "sdpa_flash"
    finally:
        torch.use_deterministic_algorithms(previous)


BACKWARD_CHOICES = [
    (attention_call(), 90, "sdpa_cudnn"),
    (attention_call(dim=256), 90, "sdpa_flash"),
    (attention_call(dim=208), 86, "sdpa_efficient"),  # flash's backward lacks (192, 224] there
    (attention_call(dim=208), 90, "sdpa_flash"),
    (attention_call(window=128), 90, "tilelang_flash_bwd"),  # torch's kernels take no window
    (attention_call(window=128), 80, "tilelang_flash_bwd"),
    (attention_call(window=128, dtype=torch.float32), 90, "reference"),
    (attention_call(q_len=9, kv_len=7), 90, "tilelang_flash_bwd"),  # rows without keys
]


@pytest.mark.parametrize("call, arch, expected", BACKWARD_CHOICES)
def test_the_backward_key_for_each_call(call, arch, expected):
    assert key(call, arch, AttentionBwdOp) == expected


REFUSALS = {  # (kernel class, the call's fields, the reason's words)
    "cudnn dims": (kernels.SdpaCudnn, {"dim": 256}, "head dims 256 and 256 are not served"),
    "cudnn causal": (kernels.SdpaCudnn, {"q_len": 70, "kv_len": 90}, "aligns to the top left"),
    "cudnn kv_len": (
        kernels.SdpaCudnn,
        {"kv_len": 1, "q_len": 64, "causal": False},
        "a key/value sequence of length 1",
    ),
    "cudnn decode": (
        kernels.SdpaCudnn,
        {"q_len": 1, "kv_len": 4096, "causal": False},
        "an execution plan for every new key length",
    ),
    "window": (kernels.SdpaFlash, {"window": 64}, "torch's SDPA kernels take no sliding window"),
    "dtype": (kernels.SdpaFlash, {"dtype": torch.float32}, "(float16, bfloat16 only)"),
    "empty rows": (kernels.SdpaFlash, {"q_len": 9, "kv_len": 7}, "log-sum-exp is +inf"),
    "flash dims": (kernels.SdpaFlash, {"v_dim": 64}, "one head dim for q, k and v"),
    "efficient decode": (kernels.SdpaEfficient, {"q_len": 1}, "grouped-query decode"),
    "efficient dims": (
        kernels.SdpaEfficient,
        {"dtype": torch.float32, "dim": 6},
        "(multiples of 4)",
    ),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_each_vendor_kernel_says_what_it_cannot_serve(name):
    cls, fields, words = REFUSALS[name]
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        assert words in (cls.refusal(attention_call(**fields)) or "")


def test_explain_names_the_refusals_and_the_winner():
    call = attention_call(dim=256)
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        text = str(AttentionFwdOp(causal=True).explain("attention", call))
    assert "sdpa_cudnn [tileops-cuda" in text and "at most 128" in text
    assert "=> sdpa_flash (chosen)" in text


def test_the_vendor_kernels_are_registered_on_both_ops():
    assert set(tileops_cuda.KERNELS[AttentionFwdOp]) == {
        "sdpa_cudnn",
        "sdpa_flash",
        "sdpa_efficient",
        *kernels.TILELANG_KEYS,
    }
    assert set(tileops_cuda.KERNELS[AttentionBwdOp]) == {
        "sdpa_cudnn",
        "sdpa_flash",
        "sdpa_efficient",
        "tilelang_flash_bwd",
    }
    assert set(tileops_cuda.KERNELS[AttentionVarlenFwdOp]) == {"sdpa_flash"}
    assert set(tileops_cuda.KERNELS[AttentionVarlenBwdOp]) == {"sdpa_flash"}


def varlen_call(heads=32, kv_heads=8, dim=128, v_dim=None, dtype=BF16, window=None, scale=0.1):
    return AttentionVarlenCall(
        device=torch.device("cuda:0"), seqs=8, heads=heads, kv_heads=kv_heads, total_q=16384,
        total_k=16384, head_dim=dim, v_dim=v_dim or dim, causal=True, scale=scale, dtype=dtype,
        window=window,
    )  # fmt: skip


VARLEN_CHOICES = [  # (call, arch, the forward's key, the backward's key)
    (varlen_call(), 90, "sdpa_flash", "sdpa_flash"),  # a packed GQA training batch
    (varlen_call(window=4096), 80, "sdpa_flash", "sdpa_flash"),  # FlashAttention's windows
    (varlen_call(dim=256, kv_heads=32), 90, "sdpa_flash", "sdpa_flash"),
    (varlen_call(dim=208), 86, "sdpa_flash", "reference"),  # its backward lacks (192, 224]
    (varlen_call(dtype=torch.float32), 90, "reference", "reference"),
    (varlen_call(dim=128, v_dim=64), 90, "reference", "reference"),
    (varlen_call(dim=36), 90, "reference", "reference"),
    (varlen_call(scale=-0.1), 90, "reference", "reference"),
]


@pytest.mark.parametrize("call, arch, forward, backward", VARLEN_CHOICES)
def test_packed_sequences_go_to_flash_attention_where_it_serves(call, arch, forward, backward):
    with simulate_device("cuda:0", arch=arch, **SIMULATED[arch]):
        assert AttentionVarlenFwdOp(causal=True).key_for("attention_varlen", call) == forward
        assert AttentionVarlenBwdOp(causal=True).key_for("attention_varlen_bwd", call) == backward


def test_the_varlen_kernels_say_what_they_cannot_serve():
    with simulate_device("cuda:0", arch=86, **SIMULATED[86]):
        refusals = [
            kernels.SdpaFlashVarlen.refusal(varlen_call(dtype=torch.float32)),
            kernels.SdpaFlashVarlen.refusal(varlen_call(v_dim=64)),
            kernels.SdpaFlashVarlen.refusal(varlen_call(scale=0.0)),
            kernels.SdpaFlashVarlenBackward.refusal(varlen_call(dim=200)),
        ]
    assert "(float16, bfloat16 only)" in refusals[0]
    assert "one head dim for q, k and v, not 128 and 64" in refusals[1]
    assert "the online softmax needs a positive scale" in refusals[2]
    assert "no kernel for head dims in (192, 224]" in refusals[3]


def test_audit_finds_no_gap_and_no_ambiguity_in_the_attention_ops(capsys):
    ops = ["AttentionFwdOp", "AttentionBwdOp", "AttentionDecodeOp", "AttentionVarlenFwdOp"]
    code = main(["audit", *ops, "AttentionVarlenBwdOp", "--arch", "80,86,90"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "OK: every probed call is served by exactly one kernel" in out
