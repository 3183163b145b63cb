"""vLLM's recurrent-state kernels under speculative-decoding indexing, against a float64 recurrence.

Hybrid models (Gated DeltaNet, Mamba, short convolutions) cannot crop a cache when drafts are
rejected, so vLLM keeps a per-position state table: request ``r`` of a speculative decode step owns
one block per query position (``spec_state_indices_tensor`` [N, k+1]); the kernel writes the state
after position ``t`` to column ``t`` and the next step starts from column ``num_accepted_tokens - 1``
(how many tokens the previous step accepted). A short convolution keeps one block per request whose
``W - 1 + k`` columns hold the window and the drafts, and the next step reads its window at column
offset ``num_accepted_tokens - 1``. The kernels (vLLM 0.33.0, Triton; run here under Triton's
interpreter on a CPU, or natively on a GPU):

- ``fused_recurrent_gated_delta_rule`` (vllm/third_party/flash_linear_attention/ops/fused_recurrent.py)
  -- the recurrent state of a Gated DeltaNet layer;
- ``selective_state_update`` (vllm/model_executor/layers/mamba/ops/mamba_ssm.py) -- Mamba's SSM
  state, with ``state_batch_indices`` (read) and ``dst_state_batch_indices`` (written);
- ``causal_conv1d_update`` (vllm/model_executor/layers/mamba/ops/causal_conv1d.py) -- the conv
  state of every hybrid layer.

Each is driven on a spec-decode **index pattern** (``Pattern``: rows with their draft counts 0..k,
``num_accepted_tokens`` 1..k+1, no-draft rows, non-spec requests interleaved in the flattened batch,
destinations that differ from the sources) and compared with a **float64 recurrence** computed in
plain torch from the same inputs and the correct slots (``simulate``): the gated delta rule
(decay ``exp(g)``, delta update with ``beta``, q/k L2-normalised as the callers ask), Mamba's
selective state update (``softplus(dt + dt_bias)``, ``exp(A dt)``, ``B``, ``C``, ``D``, gate ``z``)
and the causal conv1d update (its state window, bias, SiLU) -- each read from the kernel's own code
and docstring. ``measure`` gives the max abs and relative error per kernel and pattern, over every
output and the whole state table (written blocks and untouched ones).

**Callers.** The kernels may well be right while their callers are not: the bugs vLLM shipped were
in the indices handed to them. A caller (``Caller``) turns the batch's metadata (``Layout``) into the
kernel's index arguments (``KernelIndices``); ``correct_caller`` does what vLLM 0.33's layers do, and
the mutants do what the buggy callers did (``MUTANTS``). ``check_caller(pattern, caller)`` runs the
kernels with that caller's indices and compares, over exactly the accepted prefix (the outputs a
step keeps and the state the next step reads), with the float64 recurrence; a ``Finding`` names the
layer part (conv state / recurrent state), the kernel, the row and the pattern, and a cause read
from the evidence (which slot and column the row really started from, or which flat token's gate
rows reproduce the kernel's output).

vLLM is imported lazily (``load_kernels``), with what Triton's interpreter lacks filled in, each
recorded in ``notes``: ``fused_recurrent.py`` binds ``exp = tl.exp`` at import time (``.op``), an
alias the interpreter does not rebind, so under the interpreter it is pointed at ``tl.exp`` for the
call and restored after; the FLA ``ops`` package ``__init__`` imports ``einops`` (for an RMSNorm
this audit does not use): without einops, ``fused_recurrent.py`` is loaded on its own; and Mamba's
launch configuration asks the platform for a device name a CPU does not have, so vLLM's own
``override_ssm_config`` pins vLLM's own default heuristic. The kernels' code is not changed.
``backend="standin"`` runs ``simulate`` in float32 with the caller's indices instead of vLLM (the
default suite's tests of the checker).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["Row", "Pattern", "PATTERNS", "Dims", "Layout", "layout", "KernelIndices", "Caller", "correct_caller",
           "caller_no_draft_reads_column_0", "caller_rows_read_row0_blocks", "caller_gate_rows_not_gathered",
           "caller_state_index_off_by_one", "CALLERS", "MUTANTS", "PARTS", "make_inputs", "simulate",
           "gdn_row", "ssm_row", "conv_row", "tolerance", "measure", "Finding", "check_caller",
           "caller_findings", "load_kernels", "VllmRecurrentKernels", "U32"]

U32 = 2.0 ** -24  # float32 unit roundoff
NULL_BLOCK = 0     # vllm/v1/attention/backends/utils.py NULL_BLOCK_ID: a padded entry, never processed


# --------------------------------------------------------------------------------------------
# index patterns

@dataclass(frozen=True)
class Row:
    """One speculative-decode request: ``drafts`` draft tokens this step (query length drafts + 1),
    ``accepted`` = ``num_accepted_tokens`` (tokens the previous step accepted: its state is in column
    ``accepted - 1``), and ``accepted_now``: the prefix of this step that is kept (1..drafts + 1;
    default all), over which a caller is judged."""

    drafts: int
    accepted: int
    accepted_now: int | None = None

    @property
    def query_len(self) -> int:
        return self.drafts + 1

    @property
    def prefix(self) -> int:
        return self.query_len if self.accepted_now is None else self.accepted_now


@dataclass(frozen=True)
class Pattern:
    """A batch of rows. ``interleave[r]``: non-spec tokens (prefills, plain decodes: another kernel's
    work) placed before row r in the flattened batch, so the spec tokens must be gathered with
    ``spec_token_indx``; ``separate_dst``: the states are written to blocks other than the ones read
    (Mamba's ``dst_state_batch_indices``; the gated delta rule's ``inplace_final_state=False`` table)."""

    name: str
    rows: tuple[Row, ...]
    k: int = 3
    interleave: tuple[int, ...] = ()
    separate_dst: bool = False
    description: str = ""

    def __post_init__(self):
        for r, row in enumerate(self.rows):
            if not 0 <= row.drafts <= self.k or not 1 <= row.accepted <= self.k + 1 \
                    or not 1 <= row.prefix <= row.query_len:
                raise ValueError(f"pattern {self.name}: row {r} {row} out of range for k={self.k}")
        if self.interleave and len(self.interleave) != len(self.rows):
            raise ValueError(f"pattern {self.name}: interleave needs one count per row")


def _uniform(a: int) -> Pattern:
    return Pattern(f"accepted={a}", (Row(3, a), Row(1, a, 1)),
                   description=f"every row's previous step accepted {a} (state column {a - 1})")


PATTERNS: tuple[Pattern, ...] = (
    *(_uniform(a) for a in range(1, 5)),
    Pattern("accepted_1_to_4_by_row", (Row(3, 1, 2), Row(3, 2, 4), Row(3, 3, 1), Row(3, 4, 3)),
            description="row r's previous step accepted r + 1"),
    Pattern("no_draft_rows", (Row(3, 2, 2), Row(0, 3), Row(2, 1, 3), Row(0, 4)),
            description="rows 1 and 3 have no draft tokens this step (query length 1), their state in columns 2 and 3"),
    Pattern("all_no_draft", (Row(0, 2), Row(0, 4), Row(0, 1)),
            description="a step with no draft tokens at all (the drafter proposed none)"),
    Pattern("mixed", (Row(1, 4, 2), Row(3, 1, 1), Row(0, 2), Row(2, 3, 3)), interleave=(2, 0, 1, 0),
            description="draft counts 1, 3, 0, 2; a 2-token prefill chunk before row 0 and a plain decode "
                        "before row 2 in the flattened batch"),
    Pattern("dst_differs", (Row(3, 3, 2), Row(2, 1), Row(0, 2)), separate_dst=True,
            description="states written to blocks other than the ones read"),
)


@dataclass(frozen=True)
class Dims:
    """Small dimensions (the interpreter runs one program at a time): heads, head dim (K = V for the
    gated delta rule, the SSM's head dim), SSM state size, conv channels and width."""

    heads: int = 2
    head_dim: int = 16
    dstate: int = 16
    conv_dim: int = 16
    width: int = 4


# --------------------------------------------------------------------------------------------
# the batch's metadata, as vLLM's metadata builder makes it

@dataclass
class Layout:
    pattern: Pattern
    n_slots: int
    src: torch.Tensor            # [N, k+1] int32: row r's block for position t (a view of src_buffer)
    dst: torch.Tensor            # [N, k+1] int32: where position t's state is written (src unless separate)
    src_buffer: torch.Tensor     # [N+2, k+1]: a padding row either side (a stale block), as vLLM's
    dst_buffer: torch.Tensor     # index tensors are slices of a larger persistent buffer
    num_accepted: torch.Tensor   # [N] int32
    query_start_loc: torch.Tensor  # [N+1] int32, in the gathered (spec-token) coordinates
    spec_token_indx: torch.Tensor  # [T_spec] int64, positions of the spec tokens in the flat batch
    flat_tokens: int
    stale_slot: int
    owner: dict[int, str] = field(default_factory=dict)

    @property
    def rows(self) -> tuple[Row, ...]:
        return self.pattern.rows

    def row_tokens(self, r: int) -> slice:
        return slice(int(self.query_start_loc[r]), int(self.query_start_loc[r + 1]))


def layout(pattern: Pattern, seed: int = 0, device: str | torch.device = "cpu") -> Layout:
    """The slots and token positions of ``pattern``: every (row, column) owns its own block, the
    block numbers shuffled (rows' blocks interleave in the pool), block 0 the null block, one stale
    block for the index buffers' padding and one spare block last (so a read one column past a
    conv window stays inside the tensor)."""
    n, width = len(pattern.rows), pattern.k + 1
    per_table = n * width
    needed = per_table * (2 if pattern.separate_dst else 1) + 1
    gen = torch.Generator().manual_seed(1_000 + seed)
    pool = (torch.randperm(needed, generator=gen) + 1).to(torch.int32)
    n_slots = needed + 2  # null block 0 .. spare block last
    stale = int(pool[-1])
    src_buffer = torch.full((n + 2, width), stale, dtype=torch.int32)
    src_buffer[1:n + 1] = pool[:per_table].view(n, width)
    owner = {NULL_BLOCK: "the null block", stale: "the stale block (the index buffer's padding)",
             n_slots - 1: "the spare block"}
    for r in range(n):
        for c in range(width):
            owner[int(src_buffer[1 + r, c])] = f"row {r}, column {c}"
    if pattern.separate_dst:
        dst_buffer = torch.full((n + 2, width), stale, dtype=torch.int32)
        dst_buffer[1:n + 1] = pool[per_table:2 * per_table].view(n, width)
        for r in range(n):
            for c in range(width):
                owner[int(dst_buffer[1 + r, c])] = f"row {r}, destination column {c}"
    else:
        dst_buffer = src_buffer
    src_buffer, dst_buffer = src_buffer.to(device), dst_buffer.to(device)
    interleave = pattern.interleave or (0,) * n
    spec, position, starts = [], 0, [0]
    for row, before in zip(pattern.rows, interleave):
        position += before
        spec.extend(range(position, position + row.query_len))
        position += row.query_len
        starts.append(starts[-1] + row.query_len)
    return Layout(pattern=pattern, n_slots=n_slots, src=src_buffer[1:n + 1], dst=dst_buffer[1:n + 1],
                  src_buffer=src_buffer, dst_buffer=dst_buffer,
                  num_accepted=torch.tensor([row.accepted for row in pattern.rows], dtype=torch.int32, device=device),
                  query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
                  spec_token_indx=torch.tensor(spec, dtype=torch.int64, device=device),
                  flat_tokens=position, stale_slot=stale, owner=owner)


# --------------------------------------------------------------------------------------------
# callers: the index arguments they hand the kernels

@dataclass
class KernelIndices:
    state_indices: torch.Tensor      # [N, k+1]: GDN ssm_state_indices / SSM state_batch_indices
    dst_indices: torch.Tensor        # [N, k+1]: SSM dst_state_batch_indices
    conv_state_indices: torch.Tensor  # [N]: causal_conv1d_update conv_state_indices
    num_accepted: torch.Tensor       # [N] int32
    gate_token_indx: torch.Tensor    # flat positions of the gate rows (g, beta) handed to the GDN kernel


Caller = Callable[[Layout], KernelIndices]


def correct_caller(lay: Layout) -> KernelIndices:
    """What vLLM 0.33's layers hand the kernels (olmo_gdn_linear_attn.py, qwen_gdn_linear_attn.py,
    mamba_mixer2.py): the per-position table, ``num_accepted_tokens`` as is, the conv block
    ``spec_state_indices_tensor[:, 0]`` (a strided view) and every per-token input, gates included,
    gathered with ``spec_token_indx``."""
    return KernelIndices(state_indices=lay.src, dst_indices=lay.dst, conv_state_indices=lay.src[:, 0],
                         num_accepted=lay.num_accepted, gate_token_indx=lay.spec_token_indx)


def caller_no_draft_reads_column_0(lay: Layout) -> KernelIndices:
    """vLLM PR #52942: a row with no draft tokens this step is handled as a plain decode, which
    starts from column 0 of its table instead of column ``num_accepted_tokens - 1`` (here: its count
    handed as 1, the column the kernel's non-spec branch reads)."""
    right = correct_caller(lay)
    no_draft = torch.tensor([row.drafts == 0 for row in lay.rows], device=lay.num_accepted.device)
    right.num_accepted = torch.where(no_draft, torch.ones_like(lay.num_accepted), lay.num_accepted)
    return right


def _stride_one(table: torch.Tensor, shape) -> torch.Tensor:
    return torch.as_strided(table, shape, (1,) * len(shape), table.storage_offset())


def caller_rows_read_row0_blocks(lay: Layout) -> KernelIndices:
    """vLLM PR #55357: the slot table read with a row stride of 1 (a strided slot read over a view
    taken as contiguous), so row r >= 1 reads entry r (+ its column) of row 0's: request 0's
    checkpoint blocks."""
    right = correct_caller(lay)
    n, width = lay.src.shape
    right.state_indices = _stride_one(lay.src, (n, width))
    right.dst_indices = _stride_one(lay.dst, (n, width))
    right.conv_state_indices = _stride_one(lay.src, (n,))
    return right


def caller_gate_rows_not_gathered(lay: Layout) -> KernelIndices:
    """vLLM PR #51812: the gated delta rule's gate rows (g, beta) not gathered with the speculative
    token indices -- the first T_spec rows of the flattened batch instead, which are another
    request's when a non-spec request comes first."""
    right = correct_caller(lay)
    right.gate_token_indx = torch.arange(lay.spec_token_indx.numel(), device=lay.spec_token_indx.device)
    return right


def caller_state_index_off_by_one(lay: Layout) -> KernelIndices:
    """An off-by-one state index: the state read one column late (column ``num_accepted_tokens``
    instead of ``num_accepted_tokens - 1``), the count handed one too high."""
    right = correct_caller(lay)
    right.num_accepted = lay.num_accepted + 1
    return right


CALLERS: dict[str, Caller] = {"correct": correct_caller}
# mutant -> (caller, where the bug was shipped)
MUTANTS: dict[str, tuple[Caller, str]] = {
    "no_draft_reads_column_0": (caller_no_draft_reads_column_0, "vLLM PR #52942"),
    "rows_read_row0_blocks": (caller_rows_read_row0_blocks, "vLLM PR #55357"),
    "gate_rows_not_gathered": (caller_gate_rows_not_gathered, "vLLM PR #51812"),
    "state_index_off_by_one": (caller_state_index_off_by_one, "an off-by-one state index"),
}
CALLERS.update({name: caller for name, (caller, _) in MUTANTS.items()})


# --------------------------------------------------------------------------------------------
# inputs and the float64 recurrences

PARTS = {  # part -> (layer part, kernel, vLLM 0.33.0 source)
    "conv": ("conv state", "causal_conv1d_update", "vllm/model_executor/layers/mamba/ops/causal_conv1d.py"),
    "gdn": ("recurrent state", "fused_recurrent_gated_delta_rule",
            "vllm/third_party/flash_linear_attention/ops/fused_recurrent.py"),
    "ssm": ("recurrent state", "selective_state_update", "vllm/model_executor/layers/mamba/ops/mamba_ssm.py"),
    "ssm_tied": ("recurrent state", "selective_state_update (Mamba-2: A, dt, dt_bias tied over the head dim)",
                 "vllm/model_executor/layers/mamba/ops/mamba_ssm.py"),
}


def make_inputs(part: str, lay: Layout, dims: Dims = Dims(), seed: int = 0,
                device: str | torch.device = "cpu") -> dict:
    """float32 inputs for every token of the flat batch (spec and non-spec), the state tensors and
    the layer's parameters, from a generator seeded by ``seed`` and the part."""
    gen = torch.Generator().manual_seed(7_919 * (1 + seed) + sum(map(ord, part)))

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).float()

    t, s, h, d = lay.flat_tokens, lay.n_slots, dims.heads, dims.head_dim
    if part == "gdn":
        out = dict(q=randn(t, h, d), k=randn(t, h, d), v=randn(t, h, d),
                   g=torch.nn.functional.logsigmoid(randn(t, h, scale=2.0)),
                   beta=torch.sigmoid(randn(t, h)), state=randn(s, h, d, d), scale=d ** -0.5)
    elif part in ("ssm", "ssm_tied"):
        tied = part == "ssm_tied"
        out = dict(x=randn(t, h, d), B=randn(t, 1, dims.dstate), C=randn(t, 1, dims.dstate), D=randn(h, d),
                   z=randn(t, h, d), state=randn(s, h, d, dims.dstate), tied=tied)
        if tied:  # Mamba-2: one A, dt and dt_bias per head
            out.update(A=-torch.exp(randn(h, scale=0.5)), dt=randn(t, h, scale=0.5), dt_bias=randn(h, scale=0.5))
        else:
            out.update(A=-torch.exp(randn(h, d, dims.dstate, scale=0.5)), dt=randn(t, h, d, scale=0.5),
                       dt_bias=randn(h, d, scale=0.5))
    elif part == "conv":
        length = dims.width - 1 + lay.pattern.k  # W - 1 + k columns per block (spec decode)
        out = dict(x=randn(t, dims.conv_dim), weight=randn(dims.conv_dim, dims.width, scale=0.5),
                   bias=randn(dims.conv_dim), state=randn(s, dims.conv_dim, length), width=dims.width)
    else:
        raise ValueError(f"unknown part {part!r} (one of {', '.join(PARTS)})")
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in out.items()}


def _ssm_expanded(inputs: dict):
    """A and dt_bias as the kernel sees them: [nheads, dim, dstate] and [nheads, dim] (Mamba-2's
    per-head values as stride-0 views, as mamba_mixer2.py hands them)."""
    h, d, n = inputs["state"].shape[1:]
    if inputs["tied"]:
        return inputs["A"][:, None, None].expand(h, d, n), inputs["dt_bias"][:, None].expand(h, d)
    return inputs["A"], inputs["dt_bias"]


def gdn_row(h0, q, k, v, g, beta, scale, l2norm=True):
    """The gated delta rule over one request's tokens (fused_recurrent.py:123-166): per token,
    q, k L2-normalised (``x / sqrt(sum x^2 + 1e-6)``) when the caller asks (vLLM's do), q scaled,
    ``h *= exp(g)``, ``v' = beta (v - h k)``, ``h += v' k^T``, ``o = h q``. h0 [HV, V, K];
    q, k [n, H, K]; v [n, HV, V]; g, beta [n, HV]. Returns o [n, HV, V] and the state after each
    token [n, HV, V, K], in h0's dtype."""
    hv = h0.shape[0]
    heads = torch.arange(hv, device=h0.device) // (hv // q.shape[1])
    h, outs, states = h0.clone(), [], []
    for t in range(q.shape[0]):
        qt, kt = q[t, heads].to(h.dtype), k[t, heads].to(h.dtype)
        if l2norm:
            qt = qt / torch.sqrt((qt * qt).sum(-1, keepdim=True) + 1e-6)
            kt = kt / torch.sqrt((kt * kt).sum(-1, keepdim=True) + 1e-6)
        qt = qt * scale
        h = h * torch.exp(g[t].to(h.dtype))[:, None, None]
        vt = (v[t].to(h.dtype) - torch.einsum("hvk,hk->hv", h, kt)) * beta[t].to(h.dtype)[:, None]
        h = h + vt[:, :, None] * kt[:, None, :]
        outs.append(torch.einsum("hvk,hk->hv", h, qt))
        states.append(h)
    return torch.stack(outs), torch.stack(states)


def ssm_row(s0, x, dt, A, B, C, D, z, dt_bias, softplus=True):
    """Mamba's selective state update over one request's tokens (mamba_ssm.py:392-454): per token,
    ``dt = softplus(dt + dt_bias)`` (``log(exp(dt) + 1)`` up to 20, dt above), ``s = s exp(A dt) +
    B dt x``, ``y = sum_n s C + D x``, ``y *= z sigmoid(z)``. s0 [nheads, dim, dstate]; x, dt, z
    [n, nheads, dim]; A [nheads, dim, dstate]; B, C [n, ngroups, dstate]; D, dt_bias [nheads, dim]."""
    nheads = s0.shape[0]
    groups = torch.arange(nheads, device=s0.device) // (nheads // B.shape[1])
    s, outs, states = s0.clone(), [], []
    dtype = s.dtype
    for t in range(x.shape[0]):
        d = dt[t].to(dtype) + dt_bias.to(dtype)
        if softplus:
            d = torch.where(d <= 20.0, torch.log(torch.exp(d) + 1), d)
        xt, bt, ct = x[t].to(dtype), B[t, groups].to(dtype), C[t, groups].to(dtype)
        s = s * torch.exp(A.to(dtype) * d[..., None]) + bt[:, None, :] * d[..., None] * xt[..., None]
        y = (s * ct[:, None, :]).sum(-1) + xt * D.to(dtype)
        if z is not None:
            zt = z[t].to(dtype)
            y = y * zt * torch.sigmoid(zt)
        outs.append(y)
        states.append(s)
    return torch.stack(outs), torch.stack(states)


def conv_row(window, x, weight, bias, silu=True):
    """The causal conv1d update over one request's tokens (causal_conv1d.py:724-952): the sequence
    is the window (the W - 1 tokens before this step, [dim, W-1]) then x ([n, dim]); output t is
    ``sum_j w[:, j] seq[:, t + j] + bias``, SiLU ``a / (1 + exp(-a))``; the block's new contents are
    ``seq[:, 1:]`` (W - 2 + n columns: the window's last W - 2, then this step's tokens), of which
    the next step reads W - 1 at column offset ``num_accepted - 1``."""
    dtype = window.dtype
    seq = torch.cat([window, x.to(dtype).T], dim=1)
    width = weight.shape[1]
    outs = []
    for t in range(x.shape[0]):
        a = (seq[:, t:t + width] * weight.to(dtype)).sum(1)
        if bias is not None:
            a = a + bias.to(dtype)
        if silu:
            a = a / (1 + torch.exp(-a))
        outs.append(a)
    return torch.stack(outs), seq[:, 1:]


# --------------------------------------------------------------------------------------------
# reading index tensors as a kernel does (pointer + row * stride + column, strides honoured)

def _entry(table: torch.Tensor, *position: int) -> int:
    offset = table.storage_offset() + sum(p * s for p, s in zip(position, table.stride()))
    return int(torch.as_strided(table, (1,), (1,), offset)[0])


def _conv_window(state: torch.Tensor, slot: int, offset: int, width: int) -> torch.Tensor:
    """W - 1 columns from column ``offset`` of ``slot`` as the kernel reads them: through the
    contiguous block's flat storage, so a window past the block's last column runs on (as on the
    device)."""
    _, dim, length = state.shape
    flat = state.reshape(-1)
    base = slot * dim * length + offset
    idx = base + torch.arange(dim, device=state.device)[:, None] * length \
        + torch.arange(width - 1, device=state.device)[None, :]
    return flat[idx]


@dataclass
class Run:
    """One kernel (or simulated) call: the outputs [T_spec, ...] in the gathered token order, the
    state tensor after it, the per-token state table (the gated delta rule with
    ``inplace_final_state=False``) and per row the state after each position (simulations only)."""

    outputs: torch.Tensor
    states: torch.Tensor
    token_states: torch.Tensor | None = None
    row_states: list | None = None
    seconds: float = 0.0


def _gather(lay: Layout, tensor: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    return tensor.index_select(0, lay.spec_token_indx if index is None else index)


def simulate(part: str, inputs: dict, lay: Layout, indices: KernelIndices | None = None,
             dtype: torch.dtype = torch.float64) -> Run:
    """The recurrence applied to the blocks ``indices`` name, read as the kernel reads them (row by
    row, the row's start state read before its writes, index tensors through their strides). With
    the correct caller's indices (the default) and float64 this is **the reference**: computed
    from the inputs alone. With a caller's indices in float32 it is a stand-in for the kernel."""
    idx = indices or correct_caller(lay)
    state = inputs["state"].to(dtype).clone()
    outputs, row_states, token_states = [], [], None
    if part == "gdn":
        q, k, v = (_gather(lay, inputs[name]) for name in ("q", "k", "v"))
        g, beta = (_gather(lay, inputs[name], idx.gate_token_indx) for name in ("g", "beta"))
        inplace = not lay.pattern.separate_dst
        if not inplace:
            token_states = torch.zeros(q.shape[0], *state.shape[1:], dtype=dtype, device=state.device)
        for r in range(len(lay.rows)):
            tokens = lay.row_tokens(r)
            slot = _entry(idx.state_indices, r, int(idx.num_accepted[r]) - 1)
            if slot <= NULL_BLOCK:  # the kernel returns: nothing written, outputs left unset
                outputs.append(torch.full((tokens.stop - tokens.start, *v.shape[1:]), float("nan"), dtype=dtype))
                row_states.append(None)
                continue
            o, hs = gdn_row(state[slot], q[tokens], k[tokens], v[tokens], g[tokens], beta[tokens], inputs["scale"])
            for t in range(hs.shape[0]):
                if inplace:
                    dst = _entry(idx.state_indices, r, t)
                    if dst > NULL_BLOCK:
                        state[dst] = hs[t]
                else:
                    token_states[tokens.start + t] = hs[t]
            outputs.append(o)
            row_states.append(hs)
    elif part in ("ssm", "ssm_tied"):
        x, B, C, z = (_gather(lay, inputs[name]) for name in ("x", "B", "C", "z"))
        dt = _gather(lay, inputs["dt"])
        A, dt_bias = _ssm_expanded(inputs)
        if inputs["tied"]:
            dt = dt[:, :, None].expand(*x.shape)
        for r in range(len(lay.rows)):
            tokens = lay.row_tokens(r)
            column = max(int(idx.num_accepted[r]) - 1, 0)
            slot = _entry(idx.state_indices, r, column)
            s0 = state[slot] if slot != NULL_BLOCK else torch.zeros_like(state[0])
            o, hs = ssm_row(s0, x[tokens], dt[tokens], A, B[tokens], C[tokens], inputs["D"], z[tokens], dt_bias)
            for t in range(hs.shape[0]):
                dst = _entry(idx.dst_indices, r, t)
                if dst != NULL_BLOCK:
                    state[dst] = hs[t]
            outputs.append(o)
            row_states.append(hs)
    elif part == "conv":
        x = _gather(lay, inputs["x"])
        width = inputs["width"]
        for r in range(len(lay.rows)):
            tokens = lay.row_tokens(r)
            slot = _entry(idx.conv_state_indices, r)
            if slot == NULL_BLOCK:  # skipped: x is the kernel's output buffer, left as it was
                outputs.append(x[tokens].to(dtype))
                row_states.append(None)
                continue
            window = _conv_window(state, slot, int(idx.num_accepted[r]) - 1, width)
            o, new = conv_row(window, x[tokens], inputs["weight"], inputs["bias"])
            state[slot, :, :new.shape[1]] = new
            outputs.append(o)
            row_states.append(new)
    else:
        raise ValueError(f"unknown part {part!r}")
    return Run(outputs=torch.cat(outputs), states=state, token_states=token_states, row_states=row_states)


# --------------------------------------------------------------------------------------------
# vLLM's kernels

@dataclass
class VllmRecurrentKernels:
    gdn: Callable
    ssm: Callable
    conv: Callable
    fla_module: types.ModuleType
    ssm_module: types.ModuleType
    notes: list[str]

    @contextlib.contextmanager
    def gdn_call(self):
        """Under Triton's interpreter, ``fused_recurrent.py``'s module-level ``exp`` (``tl.exp``
        bound at import by ``.op``) is pointed at ``tl.exp`` as the interpreter rebinds it, for this
        call only."""
        from exactcheck.adapters import triton_interpreter
        module = self.fla_module
        if not triton_interpreter.interpreting():
            yield
            return
        import triton.language as tl
        saved = module.exp
        module.exp = lambda x: tl.exp(x)
        try:
            yield
        finally:
            module.exp = saved

    def ssm_launch(self, dstate: int):
        """Mamba's launch config: vLLM's own choice where the platform names its device, else vLLM's
        own default heuristic (``_get_default_ssm_launch_config``) through ``override_ssm_config``."""
        module = self.ssm_module
        try:
            module.get_ssm_device_name()
        except NotImplementedError:
            return module.override_ssm_config(module._get_default_ssm_launch_config(dstate, False))
        return contextlib.nullcontext()


_KERNELS: VllmRecurrentKernels | None = None
_FLA = "vllm.third_party.flash_linear_attention.ops"


def _load_fused_recurrent(notes: list[str]) -> types.ModuleType:
    name = f"{_FLA}.fused_recurrent"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != "einops":
            raise
    # the ops package's __init__ imports layernorm_guard (einops, for RMSNormGated): load the file
    # alone, its package stood in by a bare module for the import, then taken away
    parent = importlib.import_module(_FLA.rsplit(".", 1)[0])
    package = types.ModuleType(_FLA)
    package.__path__ = [os.path.join(os.path.dirname(parent.__file__), "ops")]
    package.__package__ = _FLA
    sys.modules[_FLA] = package
    try:
        module = importlib.import_module(name)
    finally:
        sys.modules.pop(_FLA, None)
    notes.append("einops is not installed: fused_recurrent.py loaded without its package __init__ "
                 "(which imports layernorm_guard, and einops, for an RMSNorm not used here)")
    return module


def load_kernels() -> VllmRecurrentKernels:
    """vLLM's three kernels, imported lazily (``MissingEngine`` in one line without vLLM)."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    from exactcheck.adapters import triton_interpreter
    from exactcheck.adapters.vllm import MissingEngine
    triton_interpreter.check_environment()
    notes: list[str] = []
    try:
        conv = importlib.import_module("vllm.model_executor.layers.mamba.ops.causal_conv1d")
        ssm = importlib.import_module("vllm.model_executor.layers.mamba.ops.mamba_ssm")
        fla = _load_fused_recurrent(notes)
    except ImportError as exc:
        raise MissingEngine(f"exactcheck.adapters.vllm_recurrent needs vLLM's recurrent kernels ({exc}); "
                            "the engines step installs vLLM 0.33.0 (bash .ci/engines)") from exc
    for module, fn in ((conv, "causal_conv1d_update"), (ssm, "selective_state_update")):
        if getattr(module, fn).__module__ != module.__name__:
            raise MissingEngine(f"this vLLM replaces {fn} by {getattr(module, fn).__module__} (a CPU build: "
                                "C++ ops, not the Triton kernels); install the GPU wheel with --no-deps")
    if triton_interpreter.interpreting():
        notes.append("fused_recurrent.py's `exp` (tl.exp bound at import by .op) pointed at the interpreter's "
                     "tl.exp during each call")
    try:
        ssm.get_ssm_device_name()
    except NotImplementedError:
        notes.append("selective_state_update's launch config: vLLM's default heuristic "
                     "(override_ssm_config), the platform names no device")
    _KERNELS = VllmRecurrentKernels(gdn=fla.fused_recurrent_gated_delta_rule, ssm=ssm.selective_state_update,
                                    conv=conv.causal_conv1d_update, fla_module=fla, ssm_module=ssm, notes=notes)
    return _KERNELS


def run_kernel(part: str, inputs: dict, lay: Layout, indices: KernelIndices | None = None) -> Run:
    """vLLM's kernel for ``part`` on ``inputs``, laid out as vLLM's layers lay them out, with the
    index arguments ``indices`` (the correct caller's by default); the inputs are not modified."""
    kernels = load_kernels()
    idx = indices or correct_caller(lay)
    width = lay.pattern.k + 1
    state = inputs["state"].clone()
    token_states = None
    started = time.perf_counter()
    if part == "gdn":
        q, k, v = (_gather(lay, inputs[name])[None] for name in ("q", "k", "v"))
        g, beta = (_gather(lay, inputs[name], idx.gate_token_indx)[None] for name in ("g", "beta"))
        inplace = not lay.pattern.separate_dst
        with kernels.gdn_call():
            o, final = kernels.gdn(q, k, v, g, beta, scale=inputs["scale"], initial_state=state,
                                   inplace_final_state=inplace, cu_seqlens=lay.query_start_loc,
                                   ssm_state_indices=idx.state_indices, num_accepted_tokens=idx.num_accepted,
                                   use_qk_l2norm_in_kernel=True)
        outputs = o[0]
        if not inplace:
            token_states = final
    elif part in ("ssm", "ssm_tied"):
        x, B, C, z = (_gather(lay, inputs[name]) for name in ("x", "B", "C", "z"))
        dt = _gather(lay, inputs["dt"])
        A, dt_bias = _ssm_expanded(inputs)
        if inputs["tied"]:  # stride-0 views, as mamba_mixer2.py hands them: the kernel's TIE_HDIM path
            dt = dt[:, :, None].expand(*x.shape)
        out = torch.zeros_like(x)
        with kernels.ssm_launch(state.shape[-1]):
            kernels.ssm(state, x, dt, A, B, C, inputs["D"], dt_bias, z=z, dt_softplus=True,
                        state_batch_indices=idx.state_indices, dst_state_batch_indices=idx.dst_indices,
                        out=out, num_accepted_tokens=idx.num_accepted, cu_seqlens=lay.query_start_loc)
        outputs = out
    elif part == "conv":
        x = _gather(lay, inputs["x"]).clone()  # the kernel writes its output over x
        outputs = kernels.conv(x, state, inputs["weight"], inputs["bias"], "silu",
                               conv_state_indices=idx.conv_state_indices, num_accepted_tokens=idx.num_accepted,
                               query_start_loc=lay.query_start_loc, max_query_len=width)
    else:
        raise ValueError(f"unknown part {part!r}")
    return Run(outputs=outputs, states=state, token_states=token_states, seconds=time.perf_counter() - started)


def _run(part: str, inputs: dict, lay: Layout, indices: KernelIndices | None, backend: str) -> Run:
    if backend == "vllm":
        return run_kernel(part, inputs, lay, indices)
    if backend == "standin":
        started = time.perf_counter()
        run = simulate(part, inputs, lay, indices, dtype=torch.float32)
        run.seconds = time.perf_counter() - started
        return run
    raise ValueError(f"backend must be 'vllm' or 'standin', not {backend!r}")


# --------------------------------------------------------------------------------------------
# tolerance and the measured errors

REDUCTION = {"gdn": "head_dim", "ssm": "dstate", "ssm_tied": "dstate", "conv": "width"}
SAFETY = 4
ELEMENTWISE = 8


def tolerance(part: str, pattern: Pattern, dims: Dims, scale: float) -> float:
    """How far a correct float32 kernel may be from the float64 recurrence: ``SAFETY x steps x
    (n + ELEMENTWISE) x u x scale``, u = 2^-24 (float32 inputs are exact in float64, so only the
    kernel's arithmetic rounds). Each step is length-n reductions (K for h k and h q, dstate for
    y = s C, the width for the conv), error <= n u relative to the summed magnitudes (Higham's
    gamma_n), plus about 8 rounded elementwise operations (exp, softplus, sigmoid, SiLU, the L2
    norm's sqrt and division, the scale); errors add over the k + 1 steps and do not grow
    (exp(g) <= 1, I - beta k k^T with |k| = 1 and 0 < beta < 1, exp(A dt) <= 1 for A < 0);
    SAFETY = 4 covers sums of magnitudes above the result's largest value (``scale``, at least 1).
    An index bug moves an output by O(1): four to five orders above."""
    n = getattr(dims, REDUCTION[part])
    return SAFETY * (pattern.k + 1) * (n + ELEMENTWISE) * U32 * max(1.0, scale)


def _err(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float, float]:
    """(max abs error, max |want|, relative = max abs error / max |want|)."""
    diff = (got.double() - want.double()).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    abs_err = float(diff.max()) if diff.numel() else 0.0
    scale = float(want.double().abs().max()) if want.numel() else 0.0
    return abs_err, scale, abs_err / scale if scale else abs_err


def measure(pattern: Pattern, part: str, dims: Dims = Dims(), seed: int = 0, backend: str = "vllm",
            device: str | torch.device = "cpu") -> dict:
    """The kernel on ``pattern`` with the correct indices against the float64 recurrence: max abs
    and relative error over every output, and over the whole state tensor (written blocks and
    untouched ones; with the gated delta rule's separate table, that table too), the tolerance and
    whether both are within it, and the kernel's seconds."""
    lay = layout(pattern, seed, device)
    inputs = make_inputs(part, lay, dims, seed, device)
    ref = simulate(part, inputs, lay)
    run = _run(part, inputs, lay, None, backend)
    out_abs, out_scale, out_rel = _err(run.outputs, ref.outputs)
    state_abs, state_scale, state_rel = _err(run.states, ref.states)
    if ref.token_states is not None:
        t_abs, t_scale, t_rel = _err(run.token_states, ref.token_states)
        state_abs, state_scale, state_rel = max(state_abs, t_abs), max(state_scale, t_scale), max(state_rel, t_rel)
    out_tol = tolerance(part, pattern, dims, out_scale)
    state_tol = tolerance(part, pattern, dims, state_scale)
    return dict(kernel=PARTS[part][1], part=part, pattern=pattern.name, layer_part=PARTS[part][0],
                max_abs_output=out_abs, max_rel_output=out_rel, max_abs_state=state_abs, max_rel_state=state_rel,
                tolerance_output=out_tol, tolerance_state=state_tol,
                within=bool(out_abs <= out_tol and state_abs <= state_tol), seconds=run.seconds)


# --------------------------------------------------------------------------------------------
# judging a caller over the accepted prefix

@dataclass
class Finding:
    caller: str
    pattern: str
    part: str            # conv / gdn / ssm / ssm_tied
    layer_part: str      # conv state / recurrent state
    kernel: str
    row: int
    drafts: int
    num_accepted: int
    quantity: str        # what differs: outputs of the kept prefix, or the state the next step reads
    max_abs_error: float
    tolerance: float
    cause_kind: str      # start column / another row's block / stale block / gate rows / not written / unknown
    cause: str

    def describe(self) -> str:
        return (f"{self.caller} on {self.pattern}: {self.layer_part} ({self.kernel}), row {self.row} "
                f"(drafts {self.drafts}, num_accepted_tokens {self.num_accepted}): {self.quantity} differs from "
                f"the float64 recurrence by {self.max_abs_error:.3g} (tolerance {self.tolerance:.2g}); "
                f"cause: {self.cause}")


def _owner_kind(lay: Layout, slot: int, row: int) -> str:
    who = lay.owner.get(slot, "unused")
    if who.startswith(f"row {row},"):
        return "start column"
    if who.startswith("row "):
        return "another row's block"
    if "stale" in who:
        return "stale block"
    return "unknown"


def _row_inputs(part: str, inputs: dict, lay: Layout, r: int, gate_index: torch.Tensor | None = None):
    tokens = lay.row_tokens(r)
    if part == "gdn":
        q, k, v = (_gather(lay, inputs[name])[tokens] for name in ("q", "k", "v"))
        g, beta = (_gather(lay, inputs[name], gate_index)[tokens] for name in ("g", "beta"))
        return q, k, v, g, beta
    x, B, C, z = (_gather(lay, inputs[name])[tokens] for name in ("x", "B", "C", "z"))
    dt = _gather(lay, inputs["dt"])[tokens]
    if inputs["tied"]:
        dt = dt[:, :, None].expand(*x.shape)
    return x, dt, B, C, z


def _recurrence(part: str, inputs: dict, start: torch.Tensor, row_inputs):
    if part == "gdn":
        q, k, v, g, beta = row_inputs
        return gdn_row(start, q, k, v, g, beta, inputs["scale"])
    x, dt, B, C, z = row_inputs
    A, dt_bias = _ssm_expanded(inputs)
    return ssm_row(start, x, dt, A, B, C, inputs["D"], z, dt_bias)


def _diagnose_outputs(part, inputs, lay, r, got, tol, before, after, ref) -> tuple[str, str]:
    """Which start reproduces row r's kept outputs: every block's contents before the call, every
    state a right row writes during it (``ref``), every block as the call left it (conv: every
    block and window offset); for the gated delta rule, else which flat token's gate rows, position
    by position, from the right start."""
    row = lay.rows[r]
    p = row.prefix
    if part == "conv":
        width = inputs["width"]
        x = _gather(lay, inputs["x"])[lay.row_tokens(r)]
        right_slot = int(lay.src[r, 0])
        for when, table in (("before the call", before), ("as this call left it", after)):
            for slot in range(lay.n_slots - 1):
                # up to one column past the block's end: a window the kernel reads on into the next channel
                for offset in range(table.shape[2] - (width - 1) + 2):
                    window = _conv_window(table.double(), slot, offset, width)
                    o, _ = conv_row(window, x, inputs["weight"], inputs["bias"])
                    if _err(got[:p], o[:p])[0] <= tol:
                        kind = _owner_kind(lay, slot, r) if slot != right_slot else "start column"
                        past = table.shape[2] - (width - 1) < offset
                        return kind, (f"row {r}'s conv window was read at column offset {offset} of block {slot} "
                                      f"({lay.owner.get(slot, 'unused')}, {when}"
                                      f"{'; past the block: it runs on into the next channel' if past else ''}); "
                                      f"the recurrence reads its "
                                      f"block {right_slot} at offset num_accepted_tokens - 1 = {row.accepted - 1}")
        return "unknown", "no block and column offset reproduces the row's outputs"
    row_inputs = _row_inputs(part, inputs, lay, r)
    column = row.accepted - 1
    right_slot = int(lay.src[r, column])
    expected = f"the recurrence starts from block {right_slot} (row {r}, column num_accepted_tokens - 1 = {column})"
    candidates = [(_owner_kind(lay, slot, r), f"block {slot} ({lay.owner.get(slot, 'unused')}, before the call)",
                   before[slot]) for slot in range(lay.n_slots)]
    for other, states in enumerate(ref.row_states):  # what a right row writes during the call
        for t in range(0 if states is None else states.shape[0]):
            written = "its per-token table" if part == "gdn" and lay.pattern.separate_dst else \
                f"block {int(lay.dst[other, t])}"
            candidates.append(("start column" if other == r else "another row's block",
                               f"row {other}'s state after position {t}, which this call writes to {written}",
                               states[t]))
    candidates += [(_owner_kind(lay, slot, r), f"block {slot} ({lay.owner.get(slot, 'unused')}, as this call left it)",
                    after[slot]) for slot in range(lay.n_slots)]
    for kind, what, start in candidates:
        o, _ = _recurrence(part, inputs, start.double(), row_inputs)
        if _err(got[:p], o[:p])[0] <= tol:
            return kind, f"row {r} started from {what}; {expected}"
    if part == "gdn":  # the right start: which gate rows reproduce each kept position
        q, k, v, g_flat, beta_flat = (*row_inputs[:3], inputs["g"], inputs["beta"])
        h = before[right_slot].double()
        found = []
        for t in range(p):
            for j in range(lay.flat_tokens):
                o, hs = gdn_row(h, q[t:t + 1], k[t:t + 1], v[t:t + 1], g_flat[j:j + 1], beta_flat[j:j + 1],
                                inputs["scale"])
                if _err(got[t], o[0])[0] <= tol:
                    found.append(j)
                    h = hs[0]
                    break
            else:
                break
        own = lay.spec_token_indx[lay.row_tokens(r)][:p].tolist()
        if len(found) == p and found != own:
            return "gate rows", (f"the gate rows (g, beta) of row {r}'s positions 0..{p - 1} came from flat tokens "
                                 f"{found}, not the row's own {own}: not gathered with the speculative token "
                                 f"indices (spec_token_indx)")
    return "unknown", "no block reproduces the row's outputs from its own inputs"


def _next_state(part: str, lay: Layout, run: Run, r: int, width: int) -> tuple[torch.Tensor, str]:
    """The state the next step reads for row r (its kept prefix p): the block the correct caller
    names for position p - 1 (GDN in place: the table itself; separate: the per-token table; SSM:
    the destination table), or the conv window at offset p - 1."""
    p = lay.rows[r].prefix
    if part == "conv":
        slot = int(lay.src[r, 0])
        return run.states[slot, :, p - 1:p - 1 + width - 1], f"the conv window the next step reads (block {slot})"
    if part == "gdn" and lay.pattern.separate_dst:
        position = lay.row_tokens(r).start + p - 1
        return run.token_states[position], f"the state the next step reads (token {position} of the per-token table)"
    slot = int(lay.dst[r, p - 1])
    return run.states[slot], f"the state the next step reads (block {slot}, row {r} column {p - 1})"


def _state_before(part: str, lay: Layout, inputs: dict, r: int, width: int) -> torch.Tensor | None:
    """What the location ``_next_state`` names held before the call (None for the gated delta
    rule's per-token table, which the kernel allocates)."""
    p = lay.rows[r].prefix
    if part == "conv":
        return inputs["state"][int(lay.src[r, 0]), :, p - 1:p - 1 + width - 1]
    if part == "gdn" and lay.pattern.separate_dst:
        return None
    return inputs["state"][int(lay.dst[r, p - 1])]


def caller_findings(pattern: Pattern, caller: Caller | str, parts=("conv", "gdn", "ssm"), dims: Dims = Dims(),
                    seed: int = 0, backend: str = "vllm", device: str | torch.device = "cpu") -> list[Finding]:
    """Every row where ``caller``'s indices move the kept prefix away from the float64 recurrence,
    part by part: rows whose kept outputs differ first, then rows whose outputs are right but whose
    next-step state is not."""
    name = caller if isinstance(caller, str) else getattr(caller, "__name__", "caller").removeprefix("caller_")
    caller = CALLERS[caller] if isinstance(caller, str) else caller
    lay = layout(pattern, seed, device)
    findings = []
    for part in parts:
        inputs = make_inputs(part, lay, dims, seed, device)
        ref = simulate(part, inputs, lay)
        run = _run(part, inputs, lay, caller(lay), backend)
        width = inputs.get("width", 0)
        outputs, states = [], []
        for r, row in enumerate(lay.rows):
            tokens = lay.row_tokens(r)
            got, want = run.outputs[tokens][:row.prefix], ref.outputs[tokens][:row.prefix]
            err, scale, _ = _err(got, want)
            tol = tolerance(part, pattern, dims, scale)
            common = dict(caller=name, pattern=pattern.name, part=part, layer_part=PARTS[part][0],
                          kernel=PARTS[part][1], row=r, drafts=row.drafts, num_accepted=row.accepted)
            if err > tol:
                kind, cause = _diagnose_outputs(part, inputs, lay, r, run.outputs[tokens].double(), tol,
                                                inputs["state"], run.states, ref)
                outputs.append(Finding(**common, quantity=f"the output of the kept positions 0..{row.prefix - 1}",
                                       max_abs_error=err, tolerance=tol, cause_kind=kind, cause=cause))
                continue
            got_state, what = _next_state(part, lay, run, r, width)
            want_state, _ = _next_state(part, lay, ref, r, width)
            err, scale, _ = _err(got_state, want_state)
            tol = tolerance(part, pattern, dims, scale)
            if err > tol:
                before = _state_before(part, lay, inputs, r, width)
                if before is not None and _err(got_state, before)[0] == 0.0:
                    kind, cause = "not written", ("it still holds what it held before the call: the row's states "
                                                  "were written elsewhere")
                else:
                    kind, cause = "another row's block", ("it holds another recurrence's state: another row (or "
                                                          "another position) wrote this block")
                states.append(Finding(**common, quantity=what, max_abs_error=err, tolerance=tol,
                                      cause_kind=kind, cause=cause))
        findings.extend(outputs + states)
    return findings


def check_caller(pattern: Pattern, caller: Caller | str, parts=("conv", "gdn", "ssm"), **kwargs) -> Finding | None:
    """The first finding of ``caller`` on ``pattern`` (parts in order; within a part, kept outputs
    before next-step states), or None: the caller gives the float64 recurrence over exactly the
    accepted prefix."""
    findings = caller_findings(pattern, caller, parts, **kwargs)
    return findings[0] if findings else None


def pattern_named(name: str) -> Pattern:
    for pattern in PATTERNS:
        if pattern.name == name:
            return pattern
    raise KeyError(f"no pattern {name!r} (one of {', '.join(p.name for p in PATTERNS)})")
