"""Speculative loops over models with a recurrent state: three exact ways to roll the state back,
and the mutants of the field.

A hybrid model's linear-attention layers hold a state (a convolution window and a recurrent state
per mixer) that cannot be cropped like a KV cache. After a verify call that fed the last committed
token and k drafts, of which a were accepted, the state must be the state after exactly the
committed prefix. Three exact ways, each a loop here (``toy_models.recurrent_lm`` models: their
``crop_kv``, ``read_states``, ``write_states`` and ``state_table`` are the operations a serving
engine's kernels offer):

- ``SnapshotRestoreLoop`` (llama.cpp's checkpoints, TRT-LLM's replay): snapshot the state at the
  committed position before a side's feeds; on a rejection restore it, crop the KV record and
  replay the accepted tokens;
- ``RecomputeLoop`` (recompute from the last commit): every feed of a round goes to a scratch copy
  of the cache; the committed cache is advanced over the accepted tokens only;
- ``StateTableLoop`` (vLLM's layout): the verify writes a per-position state table; the next
  step starts from column ``num_accepted - 1`` (``num_accepted`` = the accepted tokens counting
  the last committed one), read when the next step begins.

Every loop drafts ``min(draft_length, remaining - 1)`` tokens a round, so the last rounds draft
fewer and a round with no drafts happens (where vLLM's PR #52942 bit). Each cache holds the
committed sequence but its last token at the start of every round.

Mutants (each overrides one step; the cause each is found by is in the audit's verdicts):
``RejectedDraftsLeftInState`` (mlx-lm #846 / PR #1109: trimming a recurrent cache was a no-op),
``AcceptedStatesNeverCommitted`` (SGLang PR #26351), ``NoDraftStepReadsColumnZero`` (vLLM PR
#52942), ``ConvRestoredRecurrentNot`` and ``RecurrentRestoredConvNot`` (llama.cpp PR #28123: a
state part never snapshotted), ``StateIndexOffByOne``, ``BatchRowsReadRowZero`` (vLLM #55357:
rows >= 1 read request 0's checkpoint), ``GatesFromPaddedRows`` (vLLM #51812: gate rows not
gathered with the speculative indices).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from exactcheck.contracts.generator import Capabilities, DecodingPolicy, Generation
from exactcheck.contracts.reference_verifier import ReferenceVerifier

__all__ = ["SnapshotRestoreLoop", "RecomputeLoop", "StateTableLoop", "REFERENCE_LOOPS", "RejectedDraftsLeftInState",
           "AcceptedStatesNeverCommitted", "NoDraftStepReadsColumnZero", "ConvRestoredRecurrentNot",
           "RecurrentRestoredConvNot", "StateIndexOffByOne", "BatchRowsReadRowZero", "GatesFromPaddedRows",
           "RECURRENT_MUTANTS"]


@dataclass
class _Side:
    """One model in a loop: its cache, what the strategy keeps between steps, and this round's feeds."""

    role: str
    model: object
    cache: object
    fed: list = field(default_factory=list)  # tokens fed from the round's start position
    start: int = 0  # the KV length at the round's start (the committed sequence minus its last token)
    saved: object = None  # a snapshot, a scratch cache, or (table, num_accepted) pending
    scratch: object = None
    pool: dict = field(default_factory=dict)  # state tables by slot (shared by the rows of a batch)
    row: int = 0  # this generation's row in its batch


@dataclass(frozen=True)
class _RecurrentLoop:
    """The loop every strategy shares; ``begin``, ``cache_for`` and ``settle`` are the strategy."""

    draft_length: int = 3
    name: str = "exactcheck recurrent loop"
    capabilities = Capabilities(cache=True)

    # -- the loop ------------------------------------------------------------------------------
    def __call__(self, target, draft, input_ids: torch.Tensor, policy: DecodingPolicy, max_new_tokens: int,
                 seed: int, pool: dict | None = None, row: int = 0) -> Generation:
        device = target.device
        generator = torch.Generator(device=device).manual_seed(seed)
        sequence = input_ids[0].to(device)
        prompt = sequence.numel()
        pool = {} if pool is None else pool
        sides = [_Side("draft", draft, draft.new_cache(), pool=pool, row=row),
                 _Side("target", target, target.new_cache(), pool=pool, row=row)]
        with torch.no_grad():
            for side in sides:
                if prompt > 1:
                    side.model(input_ids=sequence[None, :-1], cache=side.cache, use_cache=True)
            while sequence.numel() - prompt < max_new_tokens:
                remaining = max_new_tokens - (sequence.numel() - prompt)
                k = min(self.draft_length, remaining - 1)
                generated = tuple(sequence[prompt:].tolist())
                draft_side, target_side = sides
                self._open(draft_side, sequence, k)
                drafts, rows = [], []
                feed = sequence[-1:]
                for j in range(k):
                    logits = self._feed(draft_side, feed)[-1]
                    row_q = policy.probabilities(logits[None], [generated + tuple(drafts)])[0]
                    token = int(torch.multinomial(row_q, 1, generator=generator))
                    drafts.append(token)
                    rows.append(row_q)
                    feed = torch.tensor([token], device=device)
                self._open(target_side, sequence, k)
                fed = torch.cat([sequence[-1:], torch.tensor(drafts, dtype=torch.int64, device=device)])
                logits = self._feed(target_side, fed)
                p = policy.probabilities(logits, [generated + tuple(drafts[:j]) for j in range(k + 1)])
                if k:
                    out = ReferenceVerifier()(p[None].float(), torch.stack(rows)[None].float(),
                                              torch.tensor([drafts], device=device), generator)[0]
                    emitted = out[out >= 0]
                else:
                    emitted = torch.multinomial(p[0], 1, generator=generator)
                keep, stop = _stop_at(emitted, policy)
                needed = torch.cat([sequence[-1:], emitted[:keep - 1]])
                for side in sides:
                    self._settle(side, needed)
                sequence = torch.cat([sequence, emitted[:keep]])
                if stop:
                    break
            for side in sides:
                self.finish(side)
        return Generation(sequence[None], target_cache=sides[1].cache, draft_cache=sides[0].cache)

    def _open(self, side: _Side, sequence, k: int) -> None:
        side.fed, side.start = [], side.cache.get_seq_length()
        self.begin(side, k)

    def _feed(self, side: _Side, tokens: torch.Tensor) -> torch.Tensor:
        side.fed += tokens.tolist()
        out = side.model(input_ids=tokens[None], cache=self.cache_for(side), use_cache=True)
        return out.logits[0]

    def _settle(self, side: _Side, needed: torch.Tensor) -> None:
        keep, fed = needed.numel(), len(side.fed)
        if fed < keep:  # fed fewer than were committed (a draft after a full acceptance, or no drafts)
            self.settle(side, fed)
            self.catch_up(side)
            missing = needed[fed:]
            side.fed += missing.tolist()
            side.model(input_ids=missing[None], cache=side.cache, use_cache=True)
        else:
            self.settle(side, keep)

    # -- the strategy (SnapshotRestoreLoop's by default) --------------------------------------
    def begin(self, side: _Side, k: int) -> None:
        """Before a side's feeds of a round with ``k`` drafts."""
        side.saved = side.model.read_states(side.cache)

    def cache_for(self, side: _Side):
        """The cache this round's feeds go to."""
        return side.cache

    def settle(self, side: _Side, keep: int) -> None:
        """After verification: the first ``keep`` of this round's fed tokens are committed."""
        if keep < len(side.fed):
            self.restore(side, keep)

    def catch_up(self, side: _Side) -> None:
        """Before feeding the committed tokens a side was not fed this round (its state is then
        the state after all it was fed)."""

    def restore(self, side: _Side, keep: int) -> None:
        side.model.crop_kv(side.cache, side.start)
        side.model.write_states(side.cache, side.saved)
        replay = torch.tensor(side.fed[:keep], dtype=torch.int64, device=side.model.device)
        if keep:
            side.model(input_ids=replay[None], cache=side.cache, use_cache=True)

    def finish(self, side: _Side) -> None:
        """At the end of a generation (a state table's pending column is read here)."""


def _stop_at(emitted: torch.Tensor, policy: DecodingPolicy) -> tuple[int, bool]:
    for i, token in enumerate(emitted.tolist()):
        if token in policy.stop_tokens:
            return i + 1, True
    return emitted.numel(), False


@dataclass(frozen=True)
class SnapshotRestoreLoop(_RecurrentLoop):
    """Exact: snapshot the state at the committed position; on a rejection restore it, crop the
    KV record and replay the accepted tokens."""

    name: str = "exactcheck recurrent loop: snapshot and restore"


@dataclass(frozen=True)
class RecomputeLoop(_RecurrentLoop):
    """Exact: a round's feeds go to a scratch copy of the cache; the committed cache is advanced
    over the accepted tokens alone (recompute from the last commit)."""

    name: str = "exactcheck recurrent loop: recompute from the last commit"

    def begin(self, side, k):
        side.scratch = copy.deepcopy(side.cache)

    def cache_for(self, side):
        return side.scratch

    def settle(self, side, keep):
        side.scratch = None
        tokens = torch.tensor(side.fed[:keep], dtype=torch.int64, device=side.model.device)
        if keep:
            side.model(input_ids=tokens[None], cache=side.cache, use_cache=True)


@dataclass(frozen=True)
class StateTableLoop(_RecurrentLoop):
    """Exact: vLLM's layout. The feeds of a round write a per-position state table (column j: the
    state after the first j + 1 fed tokens); the KV record is cropped to the committed length,
    and the next step starts from column ``num_accepted - 1``, read when it begins."""

    name: str = "exactcheck recurrent loop: per-position state table"

    def begin(self, side, k):
        self.resolve(side, k)
        side.saved = side.model.read_states(side.cache)

    def settle(self, side, keep):
        table = side.model.state_table(side.saved, torch.tensor([side.fed], dtype=torch.int64,
                                                                 device=side.model.device), self.gates(side))
        side.model.crop_kv(side.cache, side.start + keep)
        if keep:
            side.pool[(side.role, side.row)] = (table, keep)

    def gates(self, side):
        """The gate of each fed token per mixer, gathered for this row (None: the tokens' own)."""
        return None

    def column(self, table, num_accepted: int, k: int) -> int:
        """The column the next step starts from: ``num_accepted - 1``."""
        return num_accepted - 1

    def pending(self, side):
        """(table, num_accepted) this side's next step reads, or None."""
        return side.pool.pop((side.role, side.row), None)

    def resolve(self, side, k: int) -> None:
        pending = self.pending(side)
        if pending is not None:
            table, num_accepted = pending
            side.model.write_states(side.cache, table[self.column(table, num_accepted, k)])

    def catch_up(self, side):
        self.resolve(side, None)

    def finish(self, side):
        self.resolve(side, None)


REFERENCE_LOOPS = {"snapshot": SnapshotRestoreLoop(), "recompute": RecomputeLoop(), "state-table": StateTableLoop()}


# -- mutants from the field -------------------------------------------------------------------

@dataclass(frozen=True)
class RejectedDraftsLeftInState(SnapshotRestoreLoop):
    """mlx-lm #846 / PR #1109: trimming the cache crops the KV record but is a no-op on the
    recurrent layers, so the rejected drafts stay in the conv window and the recurrent state."""

    name: str = "mutant: rejected_drafts_left_in_state"

    def restore(self, side, keep):
        side.model.crop_kv(side.cache, side.start + keep)


@dataclass(frozen=True)
class AcceptedStatesNeverCommitted(SnapshotRestoreLoop):
    """SGLang PR #26351: after verification the state goes back to the snapshot taken before it
    and the accepted tokens are never committed into it (the KV record keeps them)."""

    name: str = "mutant: accepted_states_never_committed"

    def settle(self, side, keep):
        side.model.crop_kv(side.cache, side.start + keep)
        side.model.write_states(side.cache, side.saved)


@dataclass(frozen=True)
class ConvRestoredRecurrentNot(SnapshotRestoreLoop):
    """llama.cpp PR #28123 (the other way round): the snapshot restores the conv window but not
    the recurrent state, which keeps the rejected drafts before the replay."""

    name: str = "mutant: conv_restored_recurrent_not"

    def restore(self, side, keep):
        now = side.model.read_states(side.cache)
        side.saved = [(window, h) for (window, _), (_, h) in zip(side.saved, now)]
        super().restore(side, keep)


@dataclass(frozen=True)
class RecurrentRestoredConvNot(SnapshotRestoreLoop):
    """llama.cpp PR #28123: a conv state never snapshotted: the restore brings back the recurrent
    state while the conv window keeps the rejected drafts."""

    name: str = "mutant: recurrent_restored_conv_not"

    def restore(self, side, keep):
        now = side.model.read_states(side.cache)
        side.saved = [(window, h) for (_, h), (window, _) in zip(side.saved, now)]
        super().restore(side, keep)


@dataclass(frozen=True)
class NoDraftStepReadsColumnZero(StateTableLoop):
    """vLLM PR #52942: a step with no draft tokens reads the state table at column 0 instead of
    ``num_accepted - 1``."""

    name: str = "mutant: no_draft_step_reads_column_zero"

    def column(self, table, num_accepted, k):
        return 0 if k == 0 else num_accepted - 1  # k None: not a step (the end, a catch-up feed)


@dataclass(frozen=True)
class StateIndexOffByOne(StateTableLoop):
    """The state index one late: column ``num_accepted`` (the first rejected draft's state) where
    a draft was rejected."""

    name: str = "mutant: state_index_off_by_one"

    def column(self, table, num_accepted, k):
        return min(num_accepted, len(table) - 1)


@dataclass(frozen=True)
class GatesFromPaddedRows(StateTableLoop):
    """vLLM #51812: the gate rows are not gathered with the speculative indices: a step that fed
    fewer than ``draft_length + 1`` tokens takes its gates from the padded layout's positions
    (right-aligned: the padding's gates first), not from its own tokens."""

    name: str = "mutant: gates_from_padded_rows"

    def gates(self, side):
        fed = torch.tensor(side.fed, dtype=torch.int64, device=side.model.device)
        width = self.draft_length + 1
        if fed.numel() >= width:
            return None
        padded = torch.cat([torch.zeros(width - fed.numel(), dtype=torch.int64, device=fed.device), fed])
        return side.model.gates_of(padded[:fed.numel()])[None]


@dataclass(frozen=True)
class BatchRowsReadRowZero(StateTableLoop):
    """vLLM #55357: a batched generator whose rows >= 1 read request 0's checkpoint (a strided
    slot read): every row's next step starts from row 0's state table."""

    name: str = "mutant: batch_rows_read_row_zero"
    max_batch: int = 16

    def pending(self, side):
        own = side.pool.pop((side.role, side.row), None)
        if own is None:
            return None
        if side.row == 0:
            side.pool[("row 0", side.role)] = own
        return side.pool.get(("row 0", side.role), own)

    def generate_batch(self, target, draft, prompts, policy, max_new_tokens, seeds):
        pool: dict = {}
        return [self(target, draft, prompt[None], policy, max_new_tokens, seed, pool=pool, row=row)
                for row, (prompt, seed) in enumerate(zip(prompts, seeds))]


RECURRENT_MUTANTS = {m.name.split(": ")[1]: m for m in (
    RejectedDraftsLeftInState(), AcceptedStatesNeverCommitted(), NoDraftStepReadsColumnZero(),
    ConvRestoredRecurrentNot(), RecurrentRestoredConvNot(), StateIndexOffByOne(), BatchRowsReadRowZero(),
    GatesFromPaddedRows())}
