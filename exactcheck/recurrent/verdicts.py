"""The recurrent state's verdict: every forward call and final cache held the state of its KV
record (``exactcheck.recurrent.invariants``), or the first breach, named. A breach's summary
starts with that breach (layer, state, forward call, what it held and what it should have): the
line an engineer fixes from; the count and the parts follow."""
from __future__ import annotations

from exactcheck.options import Category, CheckKind
from exactcheck.reachability import observed_in
from exactcheck.recurrent.drive import RecurrentSamples
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict

__all__ = ["state_verdict"]


def state_verdict(run: RecurrentSamples, base: dict) -> Verdict:
    name = run.samples.world.name
    common = dict(base, check=f"{name}/state_rollback", law="state_rollback", samples=run.size,
                  condition=(f"{run.state_calls:,} forward calls (every row, layer and state part), "
                             f"{run.final_states_checked:,} final caches"),
                  kind=CheckKind.CACHE_INVARIANT)
    if run.state_breaches:
        # the target's state decides what the user receives; the draft's only what it proposes (q
        # is a proposal: a stale draft state costs acceptance, never the law), so a breach of the
        # draft's alone is a speculation finding, which gates only where it is required
        target = [(i, b) for i, b in run.state_breaches if b.role != "draft"]
        shown = target or list(run.state_breaches)
        parts = sorted({f"{b.part} ({b.role})" for _, b in run.state_breaches})
        generations = len({i for i, _ in shown if i >= 0})
        first_i, first = shown[0]
        where = f"in generation {first_i}" if first_i >= 0 else "in a batched call"
        draft_only = "" if target else (" Only the draft's state: the output law is unaffected (q is only a proposal); "
                                        "it costs acceptance.")
        count = len(run.state_breaches)
        which = "the only state not rolled back" if count == 1 else f"the first of {count:,} states not rolled back"
        return Verdict(outcome=Outcome.DEFECT, summary=(
            f"{first.describe()} ({where}; {which}: {', '.join(parts)}).{draft_only}"), evidence=FindingEvidence(
            pvalue=0.0, reachability=observed_in(max(generations, 1), run.size, "generations with a breach:")),
            category=Category.EXACTNESS if target else Category.SPECULATION, **common)
    if run.state_calls == 0 and run.final_states_checked == 0:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            "the generator made no forward call on the probe models and returned no cache"), **common)
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
        "at every forward call every conv window and recurrent state was the recurrence over exactly the tokens "
        "its KV record held" + (", and so was every final cache" if run.final_states_checked else "")), **common)
