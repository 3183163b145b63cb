"""Structured output under speculation (issue 68): the choice and reasoning-boundary worlds, their
exact laws from the world, where the grammar's end falls in a draft window, and the grammar
mutants of the reference loop."""
import math
from dataclasses import dataclass

import pytest

pytest.importorskip("transformers")

from exactcheck.e2e.batched_loop import BatchedReferenceLoop  # noqa: E402
from exactcheck.e2e.grammar_mutants import GRAMMAR_MUTANTS  # noqa: E402
from exactcheck.e2e.loop import ReferenceSpeculativeLoop, stop_at  # noqa: E402
from exactcheck.e2e.runner import run_generator_audit  # noqa: E402
from exactcheck.e2e.subjects import load_generator, loop_mutants  # noqa: E402
from exactcheck.generation.drive import drive_generator  # noqa: E402
from exactcheck.generation.laws import policy_sequence_law  # noqa: E402
from toy_models.structured import (CHOICES, END_OF_THINKING, EOS, MAYBE, NO, NOT, REASONING_MASK,  # noqa: E402
                                   THINKING_BUDGET, YES, choice_allowed, choice_world, reasoning_world)
from toy_models.suite import all_model_worlds  # noqa: E402

CHOICE, THINK = choice_world(), reasoning_world()


def test_choice_automaton_and_reasoning_mask():
    assert choice_allowed(()) == (YES, NO, MAYBE)
    assert choice_allowed((MAYBE,)) == (NOT, EOS)  # accepted, and may still go on
    assert choice_allowed((YES,)) == (EOS,) and choice_allowed((YES, YES)) == (EOS,)  # a dead prefix: only <eos>
    assert len(REASONING_MASK(())) == 9 and REASONING_MASK((0,) * THINKING_BUDGET) == (END_OF_THINKING,)
    assert REASONING_MASK((0, END_OF_THINKING)) == (YES, NO, MAYBE)
    assert REASONING_MASK((0, EOS)) == (EOS,)
    assert {w.name for w in all_model_worlds()} >= {CHOICE.name, THINK.name}


def _chain_rule_law(world) -> dict:
    """The masked law by the chain rule written out here: each row the target's float64 row at
    the prefix's state, zeroed outside the mask and renormalised."""
    rows, out = world.world.target.law(), {}
    stack = [(world.world.prompt_state, (), 1.0)]
    while stack:
        state, prefix, prob = stack.pop()
        if prefix and prefix[-1] == EOS:
            out[prefix] = prob
            continue
        allowed = world.policy.mask(prefix)
        mass = math.fsum(float(rows[state][t]) for t in allowed)
        for t in allowed:
            stack.append((int(world.world.next_state(state, t)), prefix + (t,), prob * float(rows[state][t]) / mass))
    return out


@pytest.mark.parametrize("world, outputs", [(CHOICE, 4), (THINK, 1657)], ids=lambda x: getattr(x, "name", None))
def test_exact_law_from_the_world(world, outputs):
    law = policy_sequence_law(world.world, world.policy, world.new_tokens)
    assert len(law) == outputs and abs(math.fsum(law.values()) - 1) < 1e-12
    assert all(world.validate(o) for o in law) and max(map(len, law)) + 4 == world.new_tokens
    mine = _chain_rule_law(world)
    assert mine.keys() == law.keys() and max(abs(mine[o] - law[o]) for o in law) < 1e-14
    if world is CHOICE:
        assert {o[:-1] for o in law} == set(CHOICES)
    else:
        assert not world.validate((END_OF_THINKING, NOT, EOS)) and not world.validate((0, 0, 0, 0, EOS))


@dataclass(frozen=True)
class _Blocks(ReferenceSpeculativeLoop):
    """The reference loop recording each round's emitted block."""
    log: list = None

    def stop_at(self, emitted, policy):
        self.log.append(emitted.tolist())
        return stop_at(emitted, policy)


@pytest.mark.parametrize("world, token", [(CHOICE, EOS), (THINK, END_OF_THINKING), (THINK, EOS)])
def test_the_grammar_event_falls_inside_a_draft_window(world, token):
    log: list = []
    drive_generator(_Blocks(4, log=log), world, 100, seed=5, policy=world.policy, probe=False)
    offsets = {block.index(token) for block in log if token in block}
    assert len(offsets & {1, 2, 3}) >= 2, offsets  # accepted as a draft at varied places in a block


def test_batched_reference_loop_equals_the_reference_loop_here():
    """So the false-alarm count of the batched loop (benchmarks/structured_output.py) is the
    reference loop's too."""
    for world in (CHOICE, THINK):
        one = drive_generator(ReferenceSpeculativeLoop(4), world, 40, seed=7, policy=world.policy, probe=False)
        many = drive_generator(BatchedReferenceLoop(4), world, 40, seed=7, policy=world.policy, probe=False)
        assert one.outputs == many.outputs


def test_the_grammar_mutants_are_registered():
    names = {m.name for m in loop_mutants()}
    assert all(m.name in names and load_generator("loop-mutant:" + m.name.split(": ")[1]) is m
               for m in GRAMMAR_MUTANTS)


@pytest.mark.long
def test_reference_loop_passes_the_structured_worlds():
    result = run_generator_audit(ReferenceSpeculativeLoop(), worlds=[CHOICE.name, THINK.name], generations=120,
                                 seed=11, progress=False, greedy=False)
    assert result.passed, [v.describe() for v in result.failed]


@pytest.mark.parametrize("mutant, world, n", [
    (GRAMMAR_MUTANTS[0], THINK, 60), (GRAMMAR_MUTANTS[1], CHOICE, 30), (GRAMMAR_MUTANTS[2], THINK, 60),
    (GRAMMAR_MUTANTS[3], CHOICE, 30), (GRAMMAR_MUTANTS[4], THINK, 40),
], ids=lambda x: x.name.split(": ")[1] if hasattr(x, "found_on") else getattr(x, "name", None))
def test_each_grammar_mutant_emits_outputs_the_grammar_forbids(mutant, world, n):
    """The validity check's evidence, on a small budget (the whole quick audit: the long test)."""
    assert world.name in mutant.found_on
    outputs = drive_generator(mutant, world, n, seed=2, policy=world.policy, probe=False).outputs
    exact = drive_generator(ReferenceSpeculativeLoop(), world, n, seed=2, policy=world.policy, probe=False).outputs
    assert sum(not world.validate(o) for o in outputs) > 0 and all(world.validate(o) for o in exact)


# two in the long run (.ci/run: about 25 s each), the other three (40-50 s each) in the slow run
CI_GRAMMAR_MUTANTS = {"matcher_not_rolled_back", "constraint_one_token_late"}


@pytest.mark.parametrize("mutant", [pytest.param(m, id=m.name.split(": ")[1], marks=pytest.mark.long
                                                 if m.name.split(": ")[1] in CI_GRAMMAR_MUTANTS else pytest.mark.slow)
                                    for m in GRAMMAR_MUTANTS])
def test_each_grammar_mutant_is_found_at_quick_on_the_structured_worlds(mutant):
    """The quick audit (2,000 generations, greedy identity, forced draws) of each small structured
    world the mutant is found on; the JSON world's are found within 200 generations
    (docs/end-to-end.md), and a quick audit's first 200 generations are those (same seeds)."""
    for world in [w for w in mutant.found_on if w in (CHOICE.name, THINK.name)]:
        result = run_generator_audit(mutant, worlds=[world], level="quick", seed=1, progress=False)
        assert f"{world}/valid_outputs" in {v.check for v in result.failed}, (mutant.name, world)


@pytest.mark.long
@pytest.mark.parametrize("mutant", [m for m in GRAMMAR_MUTANTS if "json_v13_k3" in m.found_on],
                         ids=lambda m: m.name.split(": ")[1])
def test_each_grammar_mutant_is_found_on_the_json_world(mutant):
    result = run_generator_audit(mutant, worlds=["json_v13_k3"], generations=200, seed=1, progress=False,
                                 greedy=False)
    assert "json_v13_k3/valid_outputs" in {v.check for v in result.failed}
