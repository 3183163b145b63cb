"""The state invariants of a generator over a model with a recurrent state.

At every forward call, for every row of the batch and every mixer (a linear-attention layer's
state ``index``: its conv window and its recurrent state), the state the model continues from must
equal a fresh recurrence over exactly the tokens its KV record holds (``fresh_states``): the
accepted prefix, nothing rejected, nothing accepted left out. A call that starts from an empty
record must start from the initial state. The KV record itself is judged by the KV invariants
(``exactcheck.generation.cache_invariants.check_calls``: committed prefix, positions); this module judges
the part a KV crop cannot roll back.

The invariant is local to a call (no final sequence is needed), so it holds for batched
generators too, and for any exact way of rolling back (a snapshot restored, a recompute from the
last commit, a per-position state table): each leaves the model reading the state of its record.

A breach names the forward call (the round), the role (target or draft), the row, the layer, the
state index, the part (conv window or recurrent state), and the accepted count of the round before
(``accepted``: the target's record grew by accepted + 1 since its previous call; None for a draft
call or the first call).

``final_states`` compares a cache a generator hands back with the recurrence over the first
``held`` tokens of the final sequence (``held``: the cache's KV length).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StateBreach", "check_state_calls", "final_states"]


@dataclass(frozen=True)
class StateBreach:
    """One mixer's state, at one forward call (-1: the final cache), that is not the recurrence
    over the tokens its KV record holds."""

    call: int
    role: str
    row: int
    layer: int
    index: int
    part: str  # "conv window" or "recurrent state"
    held: int  # tokens in the KV record
    got: object
    expected: object
    accepted: int | None = None

    @property
    def invariant(self) -> str:
        return f"{self.part} rolled back"

    def describe(self) -> str:
        where = "final cache" if self.call < 0 else f"forward call {self.call} ({self.role}, row {self.row})"
        after = "" if self.accepted is None else (f" after a round that accepted {self.accepted} "
                                                     f"draft{'s' * (self.accepted != 1)}")
        return (f"layer {self.layer} state {self.index}: the {self.part} at {where}{after} is {self.got}, the "
                f"recurrence over the {self.held} token{'s' * (self.held != 1)} its KV record holds gives "
                f"{self.expected}")


def _compare(states, expected, mixers, call: int, role: str, row: int, held: int, accepted) -> list[StateBreach]:
    out = []
    for m, got, want in zip(mixers, states, expected):
        if got is None:  # the layer had no state yet: the model starts from the initial one
            if held == 0:
                continue
            got_window, got_h = "no state (the initial one)", "no state (the initial one)"
        else:
            got_window, got_h = got.window, got.h
        if got_window != want.window:
            out.append(StateBreach(call, role, row, m.layer, m.index, "conv window", held,
                                   _tokens(got_window), _tokens(want.window), accepted))
        if got_h != want.h:
            out.append(StateBreach(call, role, row, m.layer, m.index, "recurrent state", held, got_h, want.h,
                                   accepted))
    return out


def _tokens(window):
    """A window of stored values (token + 1, 0 = empty) as the tokens it holds."""
    if isinstance(window, str):
        return window
    return [v - 1 if v else None for v in window]


def check_state_calls(calls, mixers) -> list[StateBreach]:
    """Every mixer state that breaks the invariant over the recorded ``calls``
    (``toy_models.recurrent_lm.RecurrentForwardCall``) of one or more generations."""
    from toy_models.recurrent_lm import fresh_states
    breaches: list[StateBreach] = []
    previous_target = None
    for i, call in enumerate(calls):
        states = getattr(call, "states", ())
        accepted = None
        if call.role == "target":
            if previous_target is not None and len(call.cached_tokens) > previous_target:
                accepted = len(call.cached_tokens) - previous_target - 1
            previous_target = len(call.cached_tokens)
        for row, (tokens, row_states) in enumerate(zip(call.row_tokens, states)):
            expected = fresh_states(mixers, tokens)
            breaches += _compare(row_states, expected, mixers, i, call.role, row, len(tokens), accepted)
    return breaches


def final_states(model, cache, final, role: str = "target") -> list[StateBreach]:
    """Compare the states a generator's final ``cache`` of ``model`` holds with the recurrence over
    the first ``held`` tokens of ``final`` ([T] ids; ``held``: the cache's KV length)."""
    from toy_models.recurrent_lm import MixerState, fresh_states
    if cache is None:
        return []
    held = int(cache.get_seq_length())
    tokens = [int(x) for x in final[:held]]
    try:
        read = model.read_states(cache)
    except TypeError:  # not a hybrid cache: nothing to compare (its KV invariants judge it)
        return []
    started = [cache.layers[m.layer].has_previous_state[m.index] for m in model.mixers]
    states = [MixerState(tuple(w[0].tolist()), int(h[0])) if s else None for (w, h), s in zip(read, started)]
    return _compare(states, fresh_states(model.mixers, tokens), model.mixers, -1, role, 0, held, None)
