"""exactcheck as a pytest plugin (registered through the ``pytest11`` entry point).

In a test module of your own project, one line adds the whole exactness suite for a verifier or
a generator, one reported test per check::

    from exactcheck.pytest_plugin import verifier_tests, generator_tests

    test_my_verifier = verifier_tests("my_pkg.sampling:my_verifier")   # or the callable itself
    test_my_generator = generator_tests(my_generate_fn)

Each generated test is named after its check (``test_my_verifier[three_token/bonus_token]``), so
``-k bonus_token`` selects it; all carry the ``exactcheck`` marker (``-m exactcheck``). A failing
check fails its test with the verdict (statistic, p-value, TV and its interval, smallest
detectable TV, reproduce line); an inconclusive one is skipped with its reason.

One audit per subject and session runs all of a subject's checks under one false-alarm budget
(``--exactcheck-alpha``, Holm over the statistical checks): the budget is shared by the
generated tests, not spent per test. The audit runs lazily, when the first of its tests runs,
and once per process: with pytest-xdist (``-n auto``) every worker runs the same seeded audit and
reports the tests it was given, so results do not depend on how tests are distributed. Add
``--dist loadgroup`` to send all of a subject's tests to one worker, so that its audit runs once.

Options: ``--exactcheck-level quick|standard|release`` (default quick), ``--exactcheck-seed N``
(default 0), ``--exactcheck-alpha A`` (default 1e-3), ``--exactcheck-report DIR`` (write each
audit's JSON, Markdown and HTML report there). Fixture: ``exactcheck_audit(subject, kind=...)``
returns the session's (cached) ``AuditResult`` for any subject.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

__all__ = ["verifier_tests", "generator_tests", "SubjectSpec"]

_CHECK = "exactcheck_check"


@dataclass(frozen=True)
class SubjectSpec:
    """What a generated test function audits: a subject (callable or ``MODULE:CALLABLE``), its
    kind ("verifier" or "generator"), and audit options fixed by the test author."""

    subject: object
    kind: str
    name: str
    worlds: tuple[str, ...] | None = None
    level: str | None = None  # overrides --exactcheck-level for this subject
    options: dict = field(default_factory=dict, hash=False, compare=False)

    def key(self, level: str, seed: int, alpha: float) -> tuple:
        ident = self.subject if isinstance(self.subject, str) else id(self.subject)
        return (self.kind, ident, self.worlds, level, seed, alpha)


def _spec(subject, kind: str, name: str | None, worlds, level, options) -> SubjectSpec:
    label = name or (subject if isinstance(subject, str) else
                     getattr(subject, "name", None) or getattr(subject, "__name__", None) or type(subject).__name__)
    return SubjectSpec(subject, kind, str(label), tuple(worlds) if worlds else None, level, dict(options))


def _test_function(spec: SubjectSpec):
    def test(exactcheck_check, exactcheck_session):
        exactcheck_session.report(spec, exactcheck_check)

    test.__exactcheck_spec__ = spec
    test.__doc__ = f"exactcheck: every check of {spec.kind} {spec.name}"
    # with `-n N --dist loadgroup` all of a subject's tests go to one worker: its audit runs once
    return pytest.mark.xdist_group(f"exactcheck:{spec.name}")(pytest.mark.exactcheck(test))


def verifier_tests(subject, *, name: str | None = None, worlds=None, level: str | None = None, **options):
    """A test function that pytest expands into one test per check of a step-level verifier's
    audit (``exactcheck.run_audit``; ``options`` go to it, e.g. ``properties=False``)."""
    return _test_function(_spec(subject, "verifier", name, worlds, level, options))


def generator_tests(subject, *, name: str | None = None, worlds=None, level: str | None = None, **options):
    """A test function that pytest expands into one test per check of an end-to-end generator's
    audit (``exactcheck.e2e.audit.run_generator_audit``; needs transformers)."""
    return _test_function(_spec(subject, "generator", name, worlds, level, options))


# -- the plugin hooks ---------------------------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("exactcheck", "exactness audits of speculative decoding")
    from exactcheck.plan import DEFAULT_ALPHA, DEFAULT_LEVEL, Level  # light: no torch
    group.addoption("--exactcheck-level", default=DEFAULT_LEVEL, choices=[level.value for level in Level],
                    help="audit level of the generated exactcheck tests (default quick)")
    group.addoption("--exactcheck-seed", type=int, default=0, help="root seed of the audits (default 0)")
    group.addoption("--exactcheck-alpha", type=float, default=DEFAULT_ALPHA,
                    help="false-alarm budget of each subject's audit, shared by its tests (default 1e-3)")
    group.addoption("--exactcheck-require", action="append", default=[],
                    choices=("reproducible", "input-handling"),
                    help="also fail on findings of this category (default: exactness only)")
    group.addoption("--exactcheck-report", metavar="DIR", default=None,
                    help="write each audit's JSON, Markdown and HTML report to DIR")


def pytest_configure(config):
    config.addinivalue_line("markers", "exactcheck: a test generated by exactcheck (one check of an audit)")


def _settings(config, spec: SubjectSpec) -> tuple[str, int, float]:
    return (spec.level or config.getoption("exactcheck_level"), config.getoption("exactcheck_seed"),
            config.getoption("exactcheck_alpha"))


def pytest_generate_tests(metafunc):
    spec = getattr(metafunc.function, "__exactcheck_spec__", None)
    if spec is None or _CHECK not in metafunc.fixturenames:
        return
    level, _seed, alpha = _settings(metafunc.config, spec)
    from exactcheck.plan import AuditOptions, plan_generator_audit, plan_step_audit
    if spec.kind == "verifier":
        keep = {k: v for k, v in spec.options.items() if k in ("properties", "detect_tv", "max_samples", "stop_early")}
        names = plan_step_audit(AuditOptions.build(level=level, alpha=alpha, worlds=spec.worlds,
                                                   acceptance_rule=_acceptance_rule(spec.subject), **keep)).names
    else:
        keep = {k: v for k, v in spec.options.items() if k in ("policies", "greedy")}
        names = plan_generator_audit(AuditOptions.build(level=level, alpha=alpha, worlds=spec.worlds), **keep).names
    metafunc.parametrize(_CHECK, names, ids=names)


def _acceptance_rule(subject) -> str:
    """The subject's acceptance rule (its laws depend on it), loading it if named by a string."""
    from exactcheck.errors import UsageError
    from exactcheck.step.contract import acceptance_rule
    if isinstance(subject, str):
        from exactcheck.subjects import load_subject
        try:
            subject = load_subject(subject)
        except UsageError:  # the audit reports the mistake when it runs
            return acceptance_rule(None).value
    return acceptance_rule(subject).value


class ExactcheckSession:
    """Audits run in this pytest process, one per subject and settings."""

    def __init__(self, config):
        self.config = config
        self.audits: dict[tuple, object] = {}

    def audit(self, spec: SubjectSpec):
        level, seed, alpha = _settings(self.config, spec)
        key = spec.key(level, seed, alpha)
        if key not in self.audits:
            self.audits[key] = self._run(spec, level, seed, alpha)
        return self.audits[key]

    def _run(self, spec: SubjectSpec, level: str, seed: int, alpha: float):
        from exactcheck.subjects import load_generator, load_subject
        subject = spec.subject
        if isinstance(subject, str):
            subject = load_subject(subject) if spec.kind == "verifier" else load_generator(subject)
        worlds = list(spec.worlds) if spec.worlds else None
        if spec.kind == "verifier":
            from exactcheck.audit import run_audit
            result = run_audit(subject, subject_name=spec.name, level=level, seed=seed, alpha=alpha,
                               worlds=worlds, progress=False,
                               require=self.config.getoption("exactcheck_require"), **spec.options)
        else:
            from exactcheck.e2e.audit import run_generator_audit
            result = run_generator_audit(subject, subject_name=spec.name if ":" in spec.name else None,
                                         level=level, seed=seed, alpha=alpha, worlds=worlds, progress=False,
                                         require=self.config.getoption("exactcheck_require"), **spec.options)
        directory = self.config.getoption("exactcheck_report")
        if directory:
            from exactcheck.report.files import write_report
            from exactcheck.report.json_md import audit_to_json
            stem = "audit-" + "".join(c if c.isalnum() else "-" for c in spec.name).strip("-")
            write_report(audit_to_json(result), directory, stem)
        return result

    def report(self, spec: SubjectSpec, check: str) -> None:
        """Pass, fail (with the verdict) or skip the test of ``check``."""
        from exactcheck.report.verdict import Outcome
        result = self.audit(spec)
        verdict = next((v for v in result.verdicts if v.check == check), None)
        if verdict is None:  # the world failed as a whole: its contract verdict stands for its laws
            world = check.split("/")[0]
            verdict = next((v for v in result.verdicts if v.world == world and v.outcome.failed), None)
        if verdict is None:
            pytest.fail(f"exactcheck: the audit of {spec.name} reported no verdict for {check}", pytrace=False)
        if verdict.outcome is Outcome.INCONCLUSIVE:
            pytest.skip(f"inconclusive: {verdict.summary}")
        if verdict.outcome.failed and not result.gates(verdict):
            pytest.skip(f"{verdict.category.value} finding, not required (--exactcheck-require makes it "
                        f"fail): {verdict.summary}")
        if verdict.outcome.failed:
            pytest.fail(f"{spec.name}: {verdict.describe()}", pytrace=False)


@pytest.fixture(scope="session")
def exactcheck_session(request) -> ExactcheckSession:
    """The session's audits (one per subject); used by the generated tests."""
    return ExactcheckSession(request.config)


@pytest.fixture(scope="session")
def exactcheck_audit(exactcheck_session):
    """``exactcheck_audit(subject, kind="verifier"|"generator", worlds=None, **options)``: the
    session's cached ``AuditResult`` for ``subject`` at the command line's level, seed and alpha."""
    def audit(subject, kind: str = "verifier", worlds=None, **options):
        return exactcheck_session.audit(_spec(subject, kind, None, worlds, None, options))
    return audit
