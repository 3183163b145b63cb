"""vLLM's recurrent-state kernels under speculative-decoding indexing (exactcheck.adapters.vllm_recurrent).

The engines tests (marked ``engines``; ``bash .ci/engines`` runs them under Triton's interpreter)
drive vLLM 0.33.0's ``fused_recurrent_gated_delta_rule``, ``selective_state_update`` (its Mamba-1
path and its Mamba-2 tied-head-dim path) and ``causal_conv1d_update`` on every index pattern and
hold them to the float64 recurrence within a float32 tolerance: ``SAFETY x (k+1) x (n + 8) x
2^-24 x scale`` (``vllm_recurrent.tolerance``: float32 inputs are exact in float64, so only the
kernel's arithmetic rounds; each step is length-n reductions, n = head dim, state size or conv
width, bounded by n u relative to the summed magnitudes, plus about 8 rounded elementwise
operations; errors add over the k + 1 steps and do not grow, the recurrences being contractions;
SAFETY = 4 for sums of magnitudes above the result's largest value). Measured errors sit two to
three orders below it, an index bug four to five orders above. Then the callers: the correct one is
never flagged, each mutant (the bugs vLLM shipped in its callers) is found, with its part, row and
cause. About 40 s under the interpreter on 2 cores.

The rest runs in the default suite without vLLM: the float64 recurrences against hand-computed
values and closed forms, and the caller checker driven by ``backend="standin"`` (the same
recurrence in float32, applied to the blocks the caller's indices name).
"""
from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch

from exactcheck.adapters import vllm_recurrent as vr

HAVE_ENGINE = all(importlib.util.find_spec(m) for m in ("vllm", "triton"))
RUNNABLE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def engines(test):
    """Marked ``engines`` (deselected by default), skipped without vLLM and Triton or without a GPU
    or Triton's interpreter."""
    test = pytest.mark.skipif(not RUNNABLE, reason="needs a GPU or TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=")(test)
    test = pytest.mark.skipif(not HAVE_ENGINE, reason="needs vLLM 0.33 and Triton (bash .ci/engines)")(test)
    return pytest.mark.engines(test)

PARTS = ("conv", "gdn", "ssm", "ssm_tied")
RECURRENT = ("gdn", "ssm", "ssm_tied")

# mutant -> (the pattern that shows it, the parts it must be found in, row, cause kind,
#            words of the cause: (conv state, recurrent state))
EXPECTED = {
    "no_draft_reads_column_0": ("no_draft_rows", PARTS, 1, "start column",
                                ("column offset 0 of block 6 (row 1, column 0", "block 6 (row 1, column 0")),
    "rows_read_row0_blocks": ("no_draft_rows", PARTS, 1, "another row's block",
                              ("block 9 (row 0, column 1", "row 0's state after position 3")),
    "gate_rows_not_gathered": ("mixed", ("gdn",), 0, "gate rows", (None, "flat tokens [0, 1], not the row's own [2, 3]")),
    "state_index_off_by_one": ("accepted=2", PARTS, 0, "start column",
                               ("column offset 2 of block", "(row 0, column 2, before the call)")),
}
# where a mutant's indices equal the correct ones over the kept prefix, so nothing may be flagged
HARMLESS = {
    "no_draft_reads_column_0": "accepted_1_to_4_by_row",   # no row without drafts
    "gate_rows_not_gathered": "no_draft_rows",             # no non-spec token before a spec row
}


def _check_finding(finding, mutant, part):
    pattern, _, row, kind, words = EXPECTED[mutant]
    assert finding is not None, f"{mutant} not found in {part} on {pattern}"
    assert (finding.pattern, finding.part, finding.row, finding.cause_kind) == (pattern, part, row, kind), \
        finding.describe()
    assert finding.layer_part == ("conv state" if part == "conv" else "recurrent state")
    assert words[part != "conv"] in finding.cause, finding.describe()
    assert finding.max_abs_error > 100 * finding.tolerance, finding.describe()


# ------------------------------------------------------------------ default suite: the float64 recurrence

def test_gated_delta_rule_step_by_hand():
    # h0 = diag(1, 2), g = log 0.5, beta = 0.5, k = e0, v = (3, 4), q = (1, 1), no L2 norm, scale 1:
    # h = 0.5 h0; h k = (0.5, 0); v' = 0.5 ((3, 4) - (0.5, 0)) = (1.25, 2); h += v' k^T
    # = [[1.75, 0], [2, 1]]; o = h q = (1.75, 3)
    d = torch.float64
    h0 = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=d)
    o, hs = vr.gdn_row(h0, torch.tensor([[[1.0, 1.0]]], dtype=d), torch.tensor([[[1.0, 0.0]]], dtype=d),
                       torch.tensor([[[3.0, 4.0]]], dtype=d), torch.tensor([[math.log(0.5)]], dtype=d),
                       torch.tensor([[0.5]], dtype=d), 1.0, l2norm=False)
    assert torch.allclose(o[0, 0], torch.tensor([1.75, 3.0], dtype=d), atol=1e-15)
    assert torch.allclose(hs[0, 0], torch.tensor([[1.75, 0.0], [2.0, 1.0]], dtype=d), atol=1e-15)


def test_gated_delta_rule_writes_v_at_k_and_chains_like_one_call():
    gen = torch.Generator().manual_seed(0)
    d = torch.float64
    h0 = torch.randn(2, 8, 8, generator=gen, dtype=d)
    q, k, v = (torch.randn(5, 2, 8, generator=gen, dtype=d) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    g, beta = -torch.rand(5, 2, generator=gen, dtype=d), torch.rand(5, 2, generator=gen, dtype=d)
    # the delta rule's defining property: with beta = 1 and no decay, the state then maps k to v
    _, hs = vr.gdn_row(h0, q, k, v, torch.zeros_like(g), torch.ones_like(beta), 0.5, l2norm=False)
    assert torch.allclose(torch.einsum("thvk,thk->thv", hs, k), v, atol=1e-12)
    # the recurrence over 5 tokens is the recurrence over 2, then over 3 from the state it left
    o, hs = vr.gdn_row(h0, q, k, v, g, beta, 0.5)
    o1, hs1 = vr.gdn_row(h0, q[:2], k[:2], v[:2], g[:2], beta[:2], 0.5)
    o2, hs2 = vr.gdn_row(hs1[-1], q[2:], k[2:], v[2:], g[2:], beta[2:], 0.5)
    assert torch.equal(o, torch.cat([o1, o2])) and torch.equal(hs, torch.cat([hs1, hs2]))


def test_selective_state_update_equals_its_closed_form():
    # tied head dim (Mamba-2): s_T = exp(A sum d) s_0 + sum_t exp(A sum_{u>t} d_u) d_t B_t x_t,
    # d = softplus(dt + dt_bias); y_t = sum_n s_t C_t + D x_t, times z sigmoid(z)
    gen = torch.Generator().manual_seed(1)
    d = torch.float64
    nh, dim, ds, n = 2, 3, 4, 4
    s0 = torch.randn(nh, dim, ds, generator=gen, dtype=d)
    x, z = torch.randn(n, nh, dim, generator=gen, dtype=d), torch.randn(n, nh, dim, generator=gen, dtype=d)
    dt_h, bias_h = torch.randn(n, nh, generator=gen, dtype=d), torch.randn(nh, generator=gen, dtype=d)
    A_h = -torch.rand(nh, generator=gen, dtype=d) - 0.1
    B, C = torch.randn(n, 1, ds, generator=gen, dtype=d), torch.randn(n, 1, ds, generator=gen, dtype=d)
    D = torch.randn(nh, dim, generator=gen, dtype=d)
    out, states = vr.ssm_row(s0, x, dt_h[:, :, None].expand(n, nh, dim), A_h[:, None, None].expand(nh, dim, ds),
                             B, C, D, z, bias_h[:, None].expand(nh, dim))
    dd = torch.nn.functional.softplus(dt_h + bias_h)  # [n, nh]
    for t in range(n):
        s = torch.exp(A_h * dd[:t + 1].sum(0))[:, None, None] * s0
        for u in range(t + 1):
            s = s + torch.exp(A_h * dd[u + 1:t + 1].sum(0))[:, None, None] * dd[u][:, None, None] \
                * B[u, 0][None, None, :] * x[u][:, :, None]
        assert torch.allclose(states[t], s, atol=1e-12)
        y = (s * C[t, 0]).sum(-1) + D * x[t]
        assert torch.allclose(out[t], y * z[t] * torch.sigmoid(z[t]), atol=1e-12)


def test_causal_conv1d_update_equals_conv1d_over_window_and_tokens():
    gen = torch.Generator().manual_seed(2)
    d = torch.float64
    dim, width, n = 5, 4, 3
    window = torch.randn(dim, width - 1, generator=gen, dtype=d)
    x = torch.randn(n, dim, generator=gen, dtype=d)
    weight, bias = torch.randn(dim, width, generator=gen, dtype=d), torch.randn(dim, generator=gen, dtype=d)
    out, new = vr.conv_row(window, x, weight, bias)
    seq = torch.cat([window, x.T], 1)
    want = torch.nn.functional.silu(torch.nn.functional.conv1d(seq[None], weight[:, None, :], bias, groups=dim))
    assert torch.allclose(out, want[0].T, atol=1e-13)
    # the block's new contents: the window's last W - 2 tokens, then this step's n (W - 2 + n columns)
    assert torch.equal(new, seq[:, 1:]) and new.shape[1] == width - 2 + n


def test_layouts_give_every_position_its_own_block():
    for pattern in vr.PATTERNS:
        lay = vr.layout(pattern)
        blocks = lay.src.flatten().tolist() + (lay.dst.flatten().tolist() if pattern.separate_dst else [])
        assert len(set(blocks)) == len(blocks) and vr.NULL_BLOCK not in blocks and lay.stale_slot not in blocks
        assert max(blocks) < lay.n_slots - 1  # the spare block stays free
        assert lay.spec_token_indx.numel() == int(lay.query_start_loc[-1]) == sum(r.query_len for r in pattern.rows)
        assert lay.flat_tokens == lay.spec_token_indx.numel() + sum(pattern.interleave)


def test_the_checker_through_the_float32_standin():
    """The checker's logic without vLLM: the correct caller is never flagged on any pattern, each
    mutant is found where it matters with its cause, and not where its indices are the right ones."""
    for pattern in vr.PATTERNS:
        assert vr.caller_findings(pattern, "correct", PARTS, backend="standin") == []
    for mutant, (pattern, parts, *_) in EXPECTED.items():
        findings = vr.caller_findings(vr.pattern_named(pattern), mutant, PARTS, backend="standin")
        for part in PARTS:
            first = next((f for f in findings if f.part == part), None)
            if part in parts:
                _check_finding(first, mutant, part)
            else:
                assert first is None, first.describe()
    for mutant, pattern in HARMLESS.items():
        assert vr.check_caller(vr.pattern_named(pattern), mutant, PARTS, backend="standin") is None


# ------------------------------------------------------------------ engines: vLLM's kernels

@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("pattern", [p.name for p in vr.PATTERNS])
@engines
def test_vllm_kernel_is_the_float64_recurrence_within_float32_rounding(part, pattern):
    m = vr.measure(vr.pattern_named(pattern), part, device=DEVICE)
    assert m["within"], m
    # the whole state table: written blocks and the untouched ones (and, separate, the token table)
    assert math.isfinite(m["max_abs_state"]) and math.isfinite(m["max_abs_output"]), m


@pytest.mark.parametrize("pattern", [p.name for p in vr.PATTERNS])
@engines
def test_vllm_correct_caller_is_not_flagged(pattern):
    findings = vr.caller_findings(vr.pattern_named(pattern), "correct", PARTS, device=DEVICE)
    assert findings == [], [f.describe() for f in findings]


@pytest.mark.parametrize("mutant", list(EXPECTED))
@engines
def test_vllm_caller_mutant_is_found_with_its_cause(mutant):
    pattern, parts, *_ = EXPECTED[mutant]
    for part in PARTS:
        finding = vr.check_caller(vr.pattern_named(pattern), mutant, (part,), device=DEVICE)
        if part in parts:
            _check_finding(finding, mutant, part)
        else:
            assert finding is None, finding.describe()
    if mutant in HARMLESS:
        assert vr.check_caller(vr.pattern_named(HARMLESS[mutant]), mutant, PARTS, device=DEVICE) is None
