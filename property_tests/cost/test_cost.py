"""Cost accounting: the report's figures, the exact acceptance expectation on a toy world, and the
command. Timing figures themselves are not asserted (they depend on the machine); counts are."""
import json

import pytest

pytest.importorskip("transformers")

from exactcheck.cli import main  # noqa: E402
from exactcheck.cost.generators import RequestCost, expected_accepted_per_round, run_cost, summarise  # noqa: E402
from exactcheck.e2e.loop import DilutedDraft, ReferenceSpeculativeLoop  # noqa: E402
from toy_models.hf_toy_lm import model_worlds  # noqa: E402

WORLD = model_worlds()[1]  # hf_v4_l3_k2


def _accepted(generator):
    data = run_cost(generator, world=WORLD.name, draft_lengths=(2,), prompts=200, exactness=False, progress=False)
    row = data["cost"]["by_draft_length"][0]
    return row["accepted_per_round_mean"], row["expected_accepted_per_round"]


def test_observed_acceptance_agrees_with_the_exact_expectation_and_a_diluted_drafter_shows():
    observed, expected = _accepted(ReferenceSpeculativeLoop())
    assert observed["low"] <= expected <= observed["high"], (observed, expected)
    diluted, same = _accepted(DilutedDraft())
    assert same == expected and diluted["high"] < expected, (diluted, expected)


@pytest.mark.long
def test_the_diluted_drafter_is_slower_not_wrong():
    from exactcheck.e2e.runner import run_generator_audit
    result = run_generator_audit(DilutedDraft(), level="quick", worlds=[WORLD.name], generations=500, progress=False)
    assert result.passed, [v.describe() for v in result.failed]


def test_the_exact_expectation_by_brute_force_on_a_tiny_world():
    """(L - E[R]) / E[R] against a Monte Carlo of the loop's round structure done in float64."""
    import numpy as np
    world = WORLD.world
    p, q = world.target.law(), world.draft.law()
    rng = np.random.default_rng(0)
    total_rounds, runs, length, k = 0, 20000, 3, 2
    for _ in range(runs):
        state, done = world.prompt_state, 0
        while done < length:
            total_rounds += 1
            s, emitted = state, 0
            for _i in range(k):
                x = rng.choice(world.vocab_size, p=q[s])
                if rng.random() < min(1.0, p[s, x] / q[s, x]):
                    s, emitted = world.next_state(s, x), emitted + 1
                    continue
                residual = np.clip(p[s] - q[s], 0, None)
                y = rng.choice(world.vocab_size, p=residual / residual.sum())
                s, emitted = world.next_state(s, y), emitted + 1
                break
            else:
                y = rng.choice(world.vocab_size, p=p[s])
                s, emitted = world.next_state(s, y), emitted + 1
            state, done = s, done + emitted
    mean_rounds = total_rounds / runs
    exact = expected_accepted_per_round(WORLD, k, length)
    assert abs((length - mean_rounds) / mean_rounds - exact) < 0.02


def _record(mode, prompt, k, wall, calls, tokens=8):
    return RequestCost(mode, prompt, k, 0, wall, 0.0, calls, 0 if mode == "baseline" else 2 * calls, tokens, None)


def test_speedup_and_fraction_slower_are_paired_and_a_slowdown_reads_as_one():
    records = []
    for i in range(10):
        records += [_record("baseline", i, 2, 1.0, 8), _record("speculative", i, 2, 2.0 if i < 9 else 0.5, 4)]
    summary = summarise(records)
    assert summary.speedup["estimate"] == pytest.approx(10 / 18.5)
    assert summary.speedup["high"] < 1  # slower, and the interval says so
    assert summary.fraction_slower["slower"] == 9 and summary.fraction_slower["low"] > 0.5
    assert summary.accepted_per_round_mean["estimate"] == pytest.approx(1.0)  # 8 tokens in 4 rounds
    assert summary.target_calls_per_token == {"baseline": 1.0, "speculative": 0.5}


@pytest.mark.long
def test_the_cost_command_writes_one_report_with_the_exactness_verdict(tmp_path, capsys):
    code = main(["cost", "reference-loop", "--world", WORLD.name, "--draft-lengths", "1,2", "--prompts", "4",
                 "--report", str(tmp_path), "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("Speedup") and "Exactness (end-to-end audit" in out
    data = json.loads(next(tmp_path.glob("cost-*.json")).read_text())
    cost = data["cost"]
    for key in ("speedup", "fraction_slower", "accepted_per_round_mean", "target_calls_per_token",
                "draft_calls_per_token", "peak_memory_bytes", "by_draft_length"):
        assert key in cost
    assert {"estimate", "low", "high"} <= set(cost["speedup"])
    assert [row["draft_length"] for row in cost["by_draft_length"]] == [1, 2]
    assert all(row["expected_accepted_per_round"] > 0 for row in cost["by_draft_length"])
    assert data["exactness"]["passed"] is True and data["exactness"]["kind"] == "end-to-end"
    assert "<svg" in next(tmp_path.glob("cost-*.html")).read_text()
    assert main(["render", str(next(tmp_path.glob("cost-*.json")))]) == 0


@pytest.mark.parametrize("argv", [["cost", "--draft-lengths", "1,x"], ["cost", "--prompts", "1"],
                                  ["cost", "--world", "nonsense", "--no-exactness"]])
def test_cost_misuse_is_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
