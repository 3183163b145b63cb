"""exactcheck as a pytest plugin (registered through the ``pytest11`` entry point).

In a test module of your own project, one line adds the whole exactness suite for a subject of
any audit kind that plans its checks (a verifier, a generator, a tree verifier, ...: the rows of
``exactcheck.audit_kinds.AUDIT_KINDS``), one reported test per check::

    from exactcheck.pytest_plugin import audit_tests, generator_tests, verifier_tests

    test_my_verifier = verifier_tests("my_pkg.sampling:my_verifier")   # or the callable itself
    test_my_generator = generator_tests(my_generate_fn)
    test_my_tree = audit_tests("tree", "my_pkg.eagle:verify_tree")     # audit_tests(kind, subject, ...)

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

The plugin knows no kind itself: ``audit_tests`` hands the kind to the registry, which plans and
runs its audit; ``verifier_tests`` and ``generator_tests`` are ``audit_tests`` of one kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from exactcheck.options import AuditKind

__all__ = ["audit_tests", "verifier_tests", "generator_tests", "SubjectSpec"]

_CHECK = "exactcheck_check"


@dataclass(frozen=True)
class SubjectSpec:
    """What a generated test function audits: a subject (callable or ``MODULE:CALLABLE``), its
    kind, and audit settings fixed by the test author (``AuditOptions`` fields, or what the kind
    alone takes, such as an end-to-end audit's ``policies``)."""

    subject: object
    kind: AuditKind
    name: str
    worlds: tuple[str, ...] | None = None
    level: str | None = None  # overrides --exactcheck-level for this subject
    options: dict = field(default_factory=dict, hash=False, compare=False)

    def key(self, level: str, seed: int, alpha: float) -> tuple:
        ident = self.subject if isinstance(self.subject, str) else id(self.subject)
        return (self.kind, ident, self.worlds, level, seed, alpha)


def _spec(subject, kind: AuditKind, name: str | None, worlds, level, options) -> SubjectSpec:
    label = name or (subject if isinstance(subject, str) else
                     getattr(subject, "name", None) or getattr(subject, "__name__", None) or type(subject).__name__)
    return SubjectSpec(subject, kind, str(label), tuple(worlds) if worlds else None, level, dict(options))


def _test_function(spec: SubjectSpec):
    def test(exactcheck_check, exactcheck_session):
        exactcheck_session.report(spec, exactcheck_check)

    test.__exactcheck_spec__ = spec
    test.__doc__ = f"exactcheck: every check of {spec.kind.value} {spec.name}"
    # with `-n N --dist loadgroup` all of a subject's tests go to one worker: its audit runs once
    return pytest.mark.xdist_group(f"exactcheck:{spec.name}")(pytest.mark.exactcheck(test))


def audit_tests(kind, subject, *, name: str | None = None, worlds=None, level: str | None = None, **settings):
    """A test function that pytest expands into one test per check of ``subject``'s audit of
    ``kind`` (an audit kind with a plan: ``"verifier"``, ``"generator"``, ``"tree"``, ...; see
    ``exactcheck.audit_kinds.AUDIT_KINDS``); ``settings`` go to the audit (``AuditOptions`` fields,
    or what the kind alone takes, such as an end-to-end audit's ``policies``). An unknown kind is
    a ``UsageError`` here, when the test module is collected."""
    from exactcheck.audit_kinds import entry_point
    return _test_function(_spec(subject, entry_point(kind).kind, name, worlds, level, settings))


def verifier_tests(subject, *, name: str | None = None, worlds=None, level: str | None = None, **options):
    """A test function that pytest expands into one test per check of a step-level verifier's
    audit (``exactcheck.run_audit``; ``options`` go to it, e.g. ``properties=False``)."""
    return audit_tests(AuditKind.VERIFIER, subject, name=name, worlds=worlds, level=level, **options)


def generator_tests(subject, *, name: str | None = None, worlds=None, level: str | None = None, **options):
    """A test function that pytest expands into one test per check of an end-to-end generator's
    audit (``exactcheck.run_generator_audit``; needs transformers)."""
    return audit_tests(AuditKind.GENERATOR, subject, name=name, worlds=worlds, level=level, **options)


# -- the plugin hooks ---------------------------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("exactcheck", "exactness audits of speculative decoding")
    from exactcheck.arguments import option  # light: no torch
    for name in ("level", "seed", "alpha", "require"):  # as every audit command declares them, prefixed
        option(group, name, prefix="--exactcheck-", add=group.addoption)
    group.addoption("--exactcheck-report", metavar="DIR", default=None,
                    help="write each audit's JSON, Markdown and HTML report to DIR")


def pytest_configure(config):
    config.addinivalue_line("markers", "exactcheck: a test generated by exactcheck (one check of an audit)")


def _settings(config, spec: SubjectSpec) -> dict:
    """The settings of ``spec``'s audit in this session: the command line's level, seed and alpha
    (the spec's level first), its worlds, the categories required and the author's options."""
    return dict(spec.options, level=spec.level or config.getoption("exactcheck_level"),
                seed=config.getoption("exactcheck_seed"), alpha=config.getoption("exactcheck_alpha"),
                worlds=list(spec.worlds) if spec.worlds else None,
                require=config.getoption("exactcheck_require"))


_LOAD_ERROR = "subject"  # the one test of a subject that cannot be loaded or planned


def pytest_generate_tests(metafunc):
    spec = getattr(metafunc.function, "__exactcheck_spec__", None)
    if spec is None or _CHECK not in metafunc.fixturenames:
        return
    from exactcheck.errors import UsageError
    from exactcheck.audit_kinds import plan_subject
    try:
        names = plan_subject(spec.kind, spec.subject, **_settings(metafunc.config, spec)).names
    except UsageError:  # reported by the test itself, with the reason
        names = [_LOAD_ERROR]
    metafunc.parametrize(_CHECK, names, ids=names)


class ExactcheckSession:
    """Audits run in this pytest process, one per subject and settings."""

    def __init__(self, config):
        self.config = config
        self.audits: dict[tuple, object] = {}

    def audit(self, spec: SubjectSpec):
        settings = _settings(self.config, spec)
        key = spec.key(settings["level"], settings["seed"], settings["alpha"])
        if key not in self.audits:
            self.audits[key] = self._run(spec, settings)
        return self.audits[key]

    def _run(self, spec: SubjectSpec, settings: dict):
        from exactcheck.audit_kinds import audit_subject, entry_point
        # a step audit's reproduce lines name the subject as the author does; the others' are
        # commands only when that name is MODULE:CALLABLE
        named = entry_point(spec.kind).names_any_subject or ":" in spec.name
        result = audit_subject(spec.kind, spec.subject, subject_name=spec.name if named else None,
                               progress=False, **settings)
        directory = self.config.getoption("exactcheck_report")
        if directory:  # the result read back from its report: its reproduce lines name the files written
            from exactcheck.report.files import report_stem, write_report
            from exactcheck.report.json_md import audit_from_json, audit_to_json
            data = audit_to_json(result)
            write_report(data, directory, report_stem("audit-", spec.name, result.level, result.seed))
            result = audit_from_json(data)
        return result

    def report(self, spec: SubjectSpec, check: str) -> None:
        """Pass, fail (with the verdict) or skip the test of ``check``."""
        from exactcheck.errors import UsageError
        from exactcheck.report.verdict import Outcome
        try:
            result = self.audit(spec)
        except UsageError as exc:
            pytest.fail(f"exactcheck: {spec.name}: {exc}", pytrace=False)
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
    """``exactcheck_audit(subject, kind="verifier"|"generator"|"tree"|..., worlds=None, **options)``:
    the session's cached ``AuditResult`` for ``subject`` at the command line's level, seed and alpha."""
    def audit(subject, kind: str = "verifier", worlds=None, **options):
        from exactcheck.audit_kinds import entry_point
        return exactcheck_session.audit(_spec(subject, entry_point(kind).kind, None, worlds, None, options))
    return audit
