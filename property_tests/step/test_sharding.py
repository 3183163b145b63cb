"""Sharded audits: counts merged before every look, the same verdicts on every executor."""
import numpy as np
import pytest

from exactcheck.step.runner import run_audit
from exactcheck.step.workers import shard_counts
from exactcheck.executors import LocalExecutor, shard_seed, split
from exactcheck.options import AuditOptions
from exactcheck.step.plan import plan_step_audit
from exactcheck.step.drive import drive
from exactcheck.step.mutants import MUTANTS
from exactcheck.contracts.reference_verifier import reference_verifier
from exactcheck.step.laws import compare

SUBJECTS = {"reference": reference_verifier, "bonus_argmax": MUTANTS["bonus_argmax"].verifier,
            "resample_from_target": MUTANTS["resample_from_target"].verifier}
WORLDS = ["three_token", "random_v8_k4", "ctx_v4_l5_k4"]


def _outcomes(result):
    return [(v.check, v.outcome, v.samples, v.pvalue) for v in result.verdicts]


def test_split_and_seeds():
    assert split(10, 3) == [4, 3, 3] and split(2, 4) == [1, 1] and split(7, 1) == [7]
    assert shard_seed(123, 0, 1) == 123 and shard_seed(123, 0, 2) != shard_seed(123, 1, 2)


def test_an_unsharded_audit_is_unchanged_by_the_executor_path():
    """shards = 1 keeps the batch seeds: the same verdicts as driving each batch directly."""
    options = AuditOptions.build(level="quick", worlds=["three_token"], stop_early=False, properties=False)
    plan = plan_step_audit(options)
    n = plan.world_samples("three_token")
    from exactcheck.options import derive_seed
    samples = drive(reference_verifier, plan.world("three_token"), n, derive_seed(0, "three_token"))
    direct = [compare(law, samples).counts for law in plan.world_laws("three_token")]
    through = shard_counts(reference_verifier, plan.world("three_token"), list(plan.world_laws("three_token")), n,
                           shard_seed(derive_seed(0, "three_token"), 0, 1), "cpu")
    assert all(np.array_equal(a, b) for a, b in zip(direct, through))


def test_a_fixed_budget_run_merges_shard_counts_exactly():
    options = AuditOptions.build(level="quick", worlds=["random_v8_k4"], stop_early=False, properties=False)
    plan = plan_step_audit(options)
    world, laws = plan.world("random_v8_k4"), list(plan.world_laws("random_v8_k4"))
    n, seed = plan.world_samples("random_v8_k4"), 99
    parts = [shard_counts(reference_verifier, world, laws, size, shard_seed(seed, j, 3), "cpu")
             for j, size in enumerate(split(n, 3))]
    merged = [sum(p[i] for p in parts) for i in range(len(laws))]
    unconditional = [m for m, law in zip(merged, laws) if law.condition_probability == 1.0]
    # first token, accepted length and the joint step_output law see every trial
    assert len(unconditional) == 3 and all(int(m.sum()) == n for m in unconditional)
    audit = run_audit(reference_verifier, options=AuditOptions.build(
        level="quick", worlds=["random_v8_k4"], stop_early=False, properties=False, shards=3), progress=False)
    assert audit.samples_drawn == n


@pytest.fixture(scope="module")
def ray_executor():
    pytest.importorskip("ray", reason="Ray is the optional 'distributed' extra")
    from exactcheck.executors import RayExecutor
    executor = RayExecutor(num_cpus=2)
    yield executor
    executor.close()


@pytest.mark.parametrize("name", list(SUBJECTS))
def test_ray_shards_give_the_single_process_verdicts(ray_executor, name):
    """A local 2-CPU Ray cluster, 2 shards per batch: the same verdicts (and samples, p-values)
    as the same shards run in this process; the reference passes, the mutants are caught."""
    settings = dict(level="quick", worlds=WORLDS, properties=False, shards=2, progress=False)
    local = run_audit(SUBJECTS[name], executor=LocalExecutor(), **settings)
    remote = run_audit(SUBJECTS[name], executor=ray_executor, **settings)
    assert _outcomes(local) == _outcomes(remote)
    assert remote.passed is (name == "reference")


def test_a_fixed_budget_ray_run_counts_exactly_what_one_process_counts(ray_executor):
    settings = dict(level="quick", worlds=WORLDS, properties=False, shards=2, stop_early=False, progress=False)
    local = run_audit(reference_verifier, executor=LocalExecutor(), **settings)
    remote = run_audit(reference_verifier, executor=ray_executor, **settings)
    assert local.samples_drawn == remote.samples_drawn == local.samples_planned
    for a, b in zip(local.verdicts, remote.verdicts):
        assert (a.check, a.samples, a.statistic, a.evidence) == (b.check, b.samples, b.statistic, b.evidence)


@pytest.mark.long
def test_a_sharded_end_to_end_audit_is_the_unsharded_one(ray_executor):
    """Generations keep their seeds across shards: 2 Ray shards (each with its own model copy)
    give exactly the unsharded audit's verdicts."""
    pytest.importorskip("transformers")
    from exactcheck.e2e.runner import run_generator_audit
    from exactcheck.e2e.loop import CropOffByOne, ReferenceSpeculativeLoop
    settings = dict(level="quick", worlds=["hf_v4_l3_k2"], generations=100, greedy=False, progress=False)
    for generator in (ReferenceSpeculativeLoop(), CropOffByOne()):
        one = run_generator_audit(generator, **settings)
        sharded = run_generator_audit(generator, shards=2, executor=ray_executor, **settings)
        assert _outcomes(one) == _outcomes(sharded)
        assert one.passed is (type(generator) is ReferenceSpeculativeLoop) is sharded.passed


@pytest.mark.parametrize("name, worlds", [pytest.param("reference", WORLDS, marks=pytest.mark.long),
                                          ("bonus_argmax", WORLDS[:1])], ids=["reference", "bonus_argmax"])
def test_worker_processes_give_the_serial_verdicts(name, worlds):
    """``--jobs 2``: the laws' batches and the property searches in two spawned workers, each
    building the plan from the options; every verdict is the serial run's, found or not."""
    settings = dict(level="quick", seed=5, worlds=worlds, properties=name == "reference", progress=False)
    serial = run_audit(SUBJECTS[name], **settings)
    parallel = run_audit(SUBJECTS[name], jobs=2, **settings)
    assert [v.to_dict() for v in parallel.verdicts] == [v.to_dict() for v in serial.verdicts]
    assert parallel.samples_drawn == serial.samples_drawn


def test_worker_processes_need_a_subject_that_pickles():
    from exactcheck.errors import UsageError
    with pytest.raises(UsageError, match="does not pickle"):
        run_audit(lambda *args: reference_verifier(*args), level="quick", jobs=2, progress=False)
    with pytest.raises(UsageError, match="jobs"):
        AuditOptions.build(jobs=0)
    with pytest.raises(UsageError, match="one or the other"):
        run_audit(reference_verifier, level="quick", jobs=2, shards=2, progress=False)


def ends_its_process_on_v8(target_probs, draft_probs, draft_tokens, generator):
    """Exact, but ends the process it runs in on any world of vocabulary 8."""
    if target_probs.shape[-1] == 8:
        import os
        os._exit(3)
    return reference_verifier(target_probs, draft_probs, draft_tokens, generator)


def test_a_worker_the_subject_ends_is_a_crashed_verdict_not_a_traceback():
    result = run_audit(ends_its_process_on_v8, level="quick", seed=0, jobs=2, worlds=["random_v8_k4"],
                       properties=False, progress=False)
    failed = {v.check: v for v in result.failed}
    assert "random_v8_k4/contract" in failed and "killed its process" in failed["random_v8_k4/contract"].summary
