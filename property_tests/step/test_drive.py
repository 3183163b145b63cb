"""The driver: exact draft sampling, ragged acceptance, reproducible seeds."""
import numpy as np
import pytest
import torch

from exactcheck.step.drive import drive_sequences, drive_steps
from exactcheck.contracts.reference_verifier import reference_verifier
from exactcheck.stats.goodness_of_fit import goodness_of_fit
from toy_models import context_worlds, step_worlds


def test_driver_draws_drafts_from_the_draft_law():
    world = next(w for w in step_worlds() if w.name == "random_v8_k4")
    samples = drive_steps(reference_verifier, world, 100_000, seed=4)
    law = world.draft_law()
    for i in range(world.draft_length):
        counts = np.bincount(samples.draft_tokens[:, i].numpy(), minlength=world.vocab_size)
        assert goodness_of_fit(counts, law[i], 1e-3).pvalue > 1e-4


def test_sequence_driver_handles_ragged_acceptance_and_chunks():
    world = context_worlds()[1]
    small_chunks = drive_sequences(reference_verifier, world, 3_000, seed=5, max_elements=5_000)
    assert small_chunks.sequences.shape == (3_000, world.length)
    assert (small_chunks.sequences >= 0).all() and (small_chunks.sequences < world.vocab_size).all()
    assert small_chunks.calls > 1
    again = drive_sequences(reference_verifier, world, 3_000, seed=5, max_elements=5_000)
    assert torch.equal(small_chunks.sequences, again.sequences)


def test_trust_the_draft_law_is_reproduced_exactly():
    """A verifier that accepts every draft emits k draft tokens (from q), then the bonus (from
    p), and so on: token t comes from p when t % (k+1) == k, else from q. Matching that law
    exactly shows the driver commits tokens and advances states correctly."""
    from exactcheck.step.mutants import mutant

    world = context_worlds()[0]
    vocab, length, k = world.vocab_size, world.length, world.draft_length
    law, states = np.ones(1), np.array([world.prompt_state])
    for t in range(length):
        rows = (world.target if t % (k + 1) == k else world.draft).law()
        law = (law[:, None] * rows[states]).reshape(-1)
        states = world.next_state(np.repeat(states, vocab), np.tile(np.arange(vocab), states.size))
    samples = drive_sequences(mutant("trust_draft"), world, 100_000, seed=6)
    index = samples.sequences.numpy() @ (vocab ** np.arange(length - 1, -1, -1))
    counts = np.bincount(index, minlength=vocab ** length)
    assert goodness_of_fit(counts, law, 1e-3).pvalue > 1e-4


def test_an_audit_can_size_its_calls_and_says_which_size_it_used(capsys):
    """``call_elements`` sets how many target_probs elements one verify call gets: the samples
    change (other random numbers per trial), the verdicts stay exact, the report and the
    reproducer name the size, and ``auto`` sizes to the device's free memory."""
    from exactcheck.step.runner import run_audit
    from exactcheck.cli import main
    from exactcheck.memory import device_max_elements
    from exactcheck.options import DEFAULT_CALL_ELEMENTS, AuditOptions
    from exactcheck.report.json_md import audit_from_json, audit_to_json

    settings = dict(level="quick", worlds=["ctx_v4_l5_k4"], properties=False, max_samples=20_000, progress=False)
    default = run_audit(reference_verifier, **settings)
    small = run_audit(reference_verifier, call_elements=4_000, **settings)
    assert default.call_elements == DEFAULT_CALL_ELEMENTS and small.call_elements == 4_000
    assert default.passed and small.passed
    assert default.samples_drawn == small.samples_drawn
    assert [v.statistic for v in default.verdicts] != [v.statistic for v in small.verdicts]
    assert audit_from_json(audit_to_json(small)).call_elements == 4_000
    assert all("call_elements=4000" in v.reproduce for v in small.verdicts)  # a Python call here
    assert not any("call_elements" in v.reproduce for v in default.verdicts)
    named = run_audit(reference_verifier, subject_name="exactcheck.contracts.reference_verifier:reference_verifier",
                      call_elements=4_000, **settings)
    assert all("--call-elements 4000" in v.reproduce for v in named.verdicts)  # a command
    auto = run_audit(reference_verifier, call_elements="auto", **settings)
    assert auto.passed and auto.call_elements >= device_max_elements("cpu") // 2
    assert all(f"call_elements={auto.call_elements}" in v.reproduce for v in auto.verdicts)
    assert AuditOptions.build(call_elements="auto").call_elements == "auto"  # resolved on the device

    for bad in ("0", "many"):
        assert main(["audit", "exactcheck.contracts.reference_verifier:reference_verifier", "--world", "three_token",
                     "--call-elements", bad, "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "call_elements" in err[0]
    for device in ("nonsense", "cuda:7"):  # auto on a device torch cannot use: the device's error
        assert main(["audit", "exactcheck.contracts.reference_verifier:reference_verifier", "--world", "three_token",
                     "--call-elements", "auto", "--device", device, "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "device" in err[0], err


def _random_step(batch, k, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    target = torch.rand(batch, k + 1, vocab, generator=gen) ** 4
    draft = torch.rand(batch, k, vocab, generator=gen) ** 4
    target, draft = target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)
    draft[:50] = target[:50, :k]  # p == q rows: every draft accepted, or a zero residual
    draft[50:100, 0] = target[50:100, 0] + 1e-9 * (torch.arange(vocab) == 0)  # residual ~ rounding
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=gen).view(batch, k)
    return target, draft, tokens


def test_thefused_step_is_the_reference_token_for_token():
    """``compiled_step`` (the throughput benchmark's --compile subject) runs ``fused_step`` under
    torch.compile; uncompiled, with the reference's uniforms in the reference's order, it gives
    the reference's tokens, and it flags the invalid inputs the reference refuses."""
    from exactcheck.corpus.verifiers import fused_step
    for batch, k, vocab in ((4000, 4, 32), (3000, 2, 7), (500, 8, 1000)):
        target, draft, tokens = _random_step(batch, k, vocab, seed=vocab)
        gen = torch.Generator().manual_seed(3)
        u = torch.rand(batch, k, dtype=torch.float64, generator=gen)
        v = torch.rand(batch, dtype=torch.float64, generator=gen)
        out, valid = fused_step(target, draft, tokens, u, v)
        assert torch.equal(out, reference_verifier(target, draft, tokens, torch.Generator().manual_seed(3)))
        assert bool(valid.all())
    bad = target.clone()
    bad[5, 0, tokens[5, 0]] = float("nan")
    assert (~fused_step(bad, draft, tokens, u, v)[1]).nonzero().view(-1).tolist() == [5]
    zero_q = draft.clone()
    zero_q[7, 1, tokens[7, 1]] = 0
    assert (~fused_step(target, zero_q, tokens, u, v)[1]).nonzero().view(-1).tolist() == [7]


@pytest.mark.slow
def test_compiled_driver_and_step_give_the_eager_sequences():
    """drive_sequences(compile=True) and compiled_step under torch.compile (Inductor; about 30 s
    of compiling on 2 cores): the eager driver + reference's sequences, token for token."""
    from exactcheck.corpus.verifiers import compiled_step
    world = next(w for w in context_worlds() if w.name == "ctx_v4_l5_k4")
    eager = drive_sequences(reference_verifier, world, 3000, seed=5, max_elements=1000 * 5 * 4)
    compiled = drive_sequences(compiled_step, world, 3000, seed=5, max_elements=1000 * 5 * 4, compile=True)
    assert torch.equal(eager.sequences, compiled.sequences) and eager.calls == compiled.calls
    target, draft, tokens = _random_step(4000, 4, 32, seed=1)
    assert torch.equal(compiled_step(target, draft, tokens, torch.Generator().manual_seed(3)),
                       reference_verifier(target, draft, tokens, torch.Generator().manual_seed(3)))
