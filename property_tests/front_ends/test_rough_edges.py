"""Rough edges a new user hit: the exit status of a generator that cannot be driven, report files
that overwrite each other, headlines that count non-gating findings as defects or name an
end-to-end audit "audit", a TV interval that ignores impossible outcomes, and reachability
figures that are lower bounds printed as if exact."""
import json
import re
import textwrap

import numpy as np
import pytest
from scipy import stats

from exactcheck.cli import main
from exactcheck.reachability import forced_draws, observed_in
from exactcheck.report.files import report_stem
from exactcheck.report.formats import renderer
from exactcheck.reproduce import reproducer_path
from exactcheck.stats.goodness_of_fit import INTERVAL_CONFIDENCE, goodness_of_fit

CRASHING = textwrap.dedent("""
    def gen(target, draft, input_ids, policy, max_new_tokens, seed):
        raise RuntimeError("boom: no generation at all")
""")
E2E = ["--level", "quick", "--quiet", "--world", "hf_v4_l3_k2", "--generations", "4", "--no-greedy"]


@pytest.fixture
def crashing_generator(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    (tmp_path / "rough_crash_gen.py").write_text(CRASHING)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "rough_crash_gen:gen"


# ---- 1. a generator that crashes on every generation could not be driven: exit 2 ----

def test_e2e_of_a_generator_that_crashes_on_every_world_exits_2_with_one_error_line(crashing_generator, capsys):
    assert main(["e2e", crashing_generator, *E2E]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"exactcheck: error: {crashing_generator} could not be driven: it crashed on every world "
                      "(subject raised RuntimeError: boom: no generation at all)")
    assert all(line.startswith("  ") for line in err[1:]) and any("rough_crash_gen.py" in line for line in err[1:])


# ---- 2. report files name the level and the seed: runs never overwrite each other ----

def test_report_stems_name_command_subject_level_and_seed():
    # a name not already in the slug's form gets a hash of its settings (a.b:c and a:b.c would meet)
    assert re.fullmatch(r"e2e-mod-gen-quick-seed0-h[0-9a-f]{8}", report_stem("e2e-", "mod:gen", "quick", 0))
    assert report_stem("selftest-", "", "standard", 3) == "selftest-standard-seed3"
    assert report_stem("greedy-tiny-llama-", "transformers-assisted", seed=1) == "greedy-tiny-llama-transformers-assisted-seed1"
    assert report_stem("audit-", "a.b:c") != report_stem("audit-", "a:b.c")
    stems = {report_stem("audit-", subject, level, seed) for subject in ("m:f", "m:g")
             for level in ("quick", "standard") for seed in (0, 1, -1)}
    assert len(stems) == 12 and all(re.fullmatch(r"[A-Za-z0-9_-]+", s) for s in stems)
    assert reproducer_path("properties/contract", "m:f", "quick", 1) == "reproducers/m-f--properties-contract-quick-seed1.json"
    assert reproducer_path("properties/contract", "m:f") == "reproducers/m-f--properties-contract.json"


def test_two_seeds_into_one_report_directory_leave_two_reports(crashing_generator, tmp_path, capsys):
    out = tmp_path / "reports"
    for seed in ("0", "1"):
        assert main(["e2e", crashing_generator, *E2E, "--seed", seed, "--report", str(out)]) == 2
    names = sorted(p.name for p in out.glob("*.json"))
    assert [re.sub(r"-h[0-9a-f]{8}", "", n) for n in names] == ["e2e-rough_crash_gen-gen-quick-seed0.json",
                                                                 "e2e-rough_crash_gen-gen-quick-seed1.json"]
    assert [json.loads((out / n).read_text())["seed"] for n in names] == [0, 1]


def test_two_seeds_of_a_step_audit_leave_two_reports_and_their_reproducers(tmp_path, capsys):
    for seed in ("0", "1"):
        assert main(["audit", "exactcheck.step.mutants:zero_residual_to_vocab", "--level", "quick", "--seed", seed,
                     "--world", "properties/contract", "--report", str(tmp_path), "--quiet"]) == 1
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert [re.sub(r"-h[0-9a-f]{8}", "", n) for n in names] == [
        f"audit-exactcheck-step-mutants-zero_residual_to_vocab-quick-seed{s}.json" for s in (0, 1)]
    reproducers = sorted(p.name for p in (tmp_path / "reproducers").iterdir())
    assert reproducers == [f"exactcheck.step.mutants-zero_residual_to_vocab--properties-contract-quick-seed{s}.json"
                           for s in (0, 1)]
    for seed, name in enumerate(names):  # each report's replay line names its own reproducer
        (verdict,) = json.loads((tmp_path / name).read_text())["verdicts"]
        assert verdict["reproduce"] == f"exactcheck replay {tmp_path}/reproducers/{reproducers[seed]}"
    assert main(["replay", str(tmp_path / "reproducers" / reproducers[1])]) == 1


# ---- 3. a non-gating finding is not counted as a defect in any headline ----

def test_headlines_count_a_non_gating_finding_apart_from_the_defects(tmp_path, capsys):
    args = ["audit", "exactcheck.corpus.verifiers:numpy_unseeded", "--level", "quick", "--quiet",
            "--world", "three_token", "--world", "properties/same_seed"]
    assert main(args + ["--report", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "PASSED (5 exact, 1 non-gating finding; level quick" in first, first
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    markdown, page, comment = (renderer(data["schema"], form)(data) for form in ("markdown", "html", "pr"))
    for text in (markdown, page, comment):
        assert "5 exact, 1 non-gating finding" in text and "1 defect" not in text
    assert "`properties/same_seed` (reproducibility; `--require reproducible` makes it fail)" in comment
    # required, the same finding gates: then it is a defect everywhere
    assert main(args + ["--require", "reproducible"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert "FAILED on properties/same_seed (defect) (5 exact, 1 defect;" in first and "non-gating" not in first


# ---- 4. end-to-end headlines say e2e and name the subject as the command line gave it ----

def test_e2e_headlines_say_e2e_and_name_module_and_callable(crashing_generator, tmp_path, capsys):
    main(["e2e", crashing_generator, *E2E, "--report", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith(f"exactcheck e2e {crashing_generator}: FAILED on hf_v4_l3_k2/contract (crashed)")
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert data["subject"] == crashing_generator
    markdown, page, comment = (renderer(data["schema"], form)(data) for form in ("markdown", "html", "pr"))
    assert markdown.startswith(f"# exactcheck e2e `{crashing_generator}`: FAILED")
    assert f"<title>exactcheck e2e {crashing_generator}: FAILED</title>" in page
    assert f"exactcheck e2e <code>{crashing_generator}</code>" in page
    assert comment.startswith(f"### ❌ exactcheck e2e: `{crashing_generator}` FAILS")
    assert "exactcheck audit" not in markdown + page + comment


def test_a_built_in_generator_keeps_its_own_name_and_lossy_stays_marked(crashing_generator, tmp_path, capsys):
    assert main(["e2e", "reference-loop", *E2E]) == 0
    assert capsys.readouterr().out.startswith("exactcheck e2e exactcheck reference speculative loop: PASSED")
    (tmp_path / "rough_lossy_gen.py").write_text(CRASHING + "gen.lossy = True\n")
    main(["e2e", "rough_lossy_gen:gen", *E2E])
    assert capsys.readouterr().out.startswith("exactcheck e2e rough_lossy_gen:gen [lossy by design]: FAILED")


# ---- 5. impossible outcomes put the TV interval's lower end above 0 ----

def test_impossible_outcomes_give_a_tv_interval_above_zero():
    law = np.array([0.25, 0.25, 0.25, 0.25, 0.0])
    counts = np.array([10, 10, 10, 0, 6])  # 6 of 36 on the impossible cell
    gof = goodness_of_fit(counts, law, 1e-3)
    low, high = gof.tv_interval
    error = (1 - INTERVAL_CONFIDENCE) / 4  # the lower end's 2.5%, shared with the pooled bound
    assert low >= stats.beta.ppf(error, 6, 36 - 6 + 1) > 0.05
    assert low <= 6 / 36 <= gof.tv_estimate <= high
    one = goodness_of_fit(np.array([500, 499, 1]), np.array([0.5, 0.5, 0.0]), 1e-3).tv_interval
    assert 0 < one[0] < 1e-3  # a single impossible sample of 1,000: small, but above 0
    assert goodness_of_fit(np.array([500, 500, 0]), np.array([0.5, 0.5, 0.0]), 1e-3).tv_interval[0] == 0.0


def test_a_law_without_impossible_cells_keeps_its_interval():
    """The interval of a law with no cell of probability 0 is the one computed before the change."""
    law = np.random.default_rng(5).dirichlet(np.ones(12))
    counts = np.array([554, 267, 422, 213, 25, 129, 225, 52, 80, 279, 341, 413])
    assert goodness_of_fit(counts, law, 1e-3).tv_interval == pytest.approx((0.01749737834782615, 0.1082379900710233),
                                                                           rel=1e-12)


def test_the_lower_end_still_covers_the_true_tv_with_impossible_mass():
    """A subject putting mass 0.02 on the impossible cell and off elsewhere: the lower end stays
    below the true TV in at least 97.5% of runs (allowing binomial noise)."""
    rng = np.random.default_rng(17)
    law = np.append(rng.dirichlet(np.ones(8)), 0.0)
    alt = np.append(0.98 * (0.95 * law[:-1] + 0.05 * rng.dirichlet(np.ones(8))), 0.02)
    true_tv = 0.5 * np.abs(alt - law).sum()
    runs = 300
    misses = sum(goodness_of_fit(rng.multinomial(400, alt), law, 1e-3).tv_interval[0] > true_tv for _ in range(runs))
    assert misses <= stats.binom.isf(1e-3, runs, 0.025), misses


# ---- 6. a forced set's probability is a lower bound per call, and says so ----

def test_forced_draw_reachability_reads_as_a_lower_bound():
    float32 = forced_draws([2.0 ** -24], ["float32"], ["torch.rand"], 0.0)
    assert float32.lower_bound
    assert float32.describe() == "1 forced draw of torch.rand (float32) at 0.0: probability at least 2^-24 (5.96e-08) per call"
    unshrunk = forced_draws([2.0 ** -53] * 2, ["float64"] * 2, ["torch.rand"], 0.0, minimal=False)
    assert "probability at least 2^-106" in unshrunk.describe() and "not fully shrunk" in unshrunk.describe()
    # a half-precision draw's per-value figure is an upper bound: the product is no lower bound
    half = forced_draws([2.0 ** -11], ["float16"], ["torch.rand"], 0.0)
    assert not half.lower_bound and "probability 2^-11" in half.describe() and "at least" not in half.describe()
    # an observed frequency is not a bound, and keeps its wording
    seen = observed_in(3, 10, "invalid outputs:")
    assert not seen.lower_bound and seen.describe() == "seen with ordinary random numbers: invalid outputs: 3 of 10"


def test_a_forced_uniform_finding_prints_its_reachability_as_at_least(capsys):
    assert main(["audit", "exactcheck.step.mutants:accept_on_equal_uniform", "--level", "quick",
                 "--world", "properties/no_forbidden_token", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "reachability: 1 forced draw of torch.rand (float64) at 0.0: probability at least 2^-53" in out
