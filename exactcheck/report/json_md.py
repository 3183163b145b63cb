"""Reports: a versioned JSON envelope built from the verdicts, and Markdown rendered from that
JSON (so a report can be re-rendered without re-running the audit)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from exactcheck.options import DEFAULT_REQUIRE, Category, CheckKind
from exactcheck.report.escaping import fence, inline_code, md_cell, md_text
from exactcheck.report.result import AuditResult, result_type
from exactcheck.report.ranking import how_reachable, not_run, not_run_line, rank_failures
from exactcheck.report.verdict import Outcome, Verdict

if TYPE_CHECKING:
    from exactcheck.report.result import GateResult, SelftestResult

__all__ = ["AUDIT_SCHEMA", "SELFTEST_SCHEMA", "GATE_SCHEMA", "audit_to_json", "audit_from_json",
           "render_audit_markdown", "selftest_to_json", "render_selftest_markdown", "gate_to_json",
           "deterministic_finding"]

AUDIT_SCHEMA = "exactcheck.audit/1"
SELFTEST_SCHEMA = "exactcheck.selftest/1"
GATE_SCHEMA = "exactcheck.gate/1"


def audit_to_json(result: AuditResult) -> dict:
    return {
        "schema": AUDIT_SCHEMA,
        "kind": result.label,
        "subject": result.subject,
        "level": result.level,
        "seed": result.seed,
        "alpha": result.alpha,
        "device": result.device,
        "started": result.started,
        "duration_s": round(result.duration_s, 3),
        "environment": result.environment,
        "budget": result.budget_fields(),
        **({"rule": result.rule_fields()} if result.rule_fields() is not None else {}),
        "require": list(result.require),
        "summary": {
            "passed": result.passed,
            "checks": len(result.verdicts),
            **{o.value: result.count(o) for o in Outcome},
            "findings_by_category": {c.value: sum(v.outcome.failed and v.category is c for v in result.verdicts)
                                     for c in Category},
        },
        "verdicts": [v.to_dict() for v in result.verdicts],
    }


def audit_from_json(data: dict) -> AuditResult:
    """The typed result of a JSON audit report (``exactcheck.report.result.result_type``; the
    type's ``report_fields`` reads its own fields); reports written by earlier versions read the
    same way."""
    if data.get("schema") != AUDIT_SCHEMA:
        raise ValueError(f"not an exactcheck audit report (schema {data.get('schema')!r})")
    kind = result_type(data)
    return kind(
        subject=data["subject"], seed=data["seed"], device=data["device"],
        verdicts=tuple(Verdict.from_dict(v, kind.law_check) for v in data["verdicts"]),
        started=data["started"], duration_s=data["duration_s"], environment=data["environment"],
        require=tuple(data.get("require", DEFAULT_REQUIRE)), **kind.report_fields(data))


def _fmt(x, spec: str = ".4f") -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    return format(x, spec)


def _p(x) -> str:
    if x is None:
        return "–"
    x = float(x)
    return "0" if x == 0 else (f"{x:.3g}" if x >= 1e-3 else f"{x:.1e}")


def render_audit_markdown(data: dict) -> str:
    result = audit_from_json(data)
    status = "INCOMPLETE (interrupted)" if result.interrupted else ("PASSED" if result.passed else "FAILED")
    counts = result.counts_text()
    env = result.environment
    versions = (f"exactcheck {md_text(env.get('exactcheck'))}, torch {md_text(env.get('torch'))}"
                + (f", transformers {md_text(env['transformers'])}" if "transformers" in env else ""))
    lines = [
        f"# exactcheck {result.command} {inline_code(result.subject)}: {status}",
        "",
        (f"Level **{md_text(result.level)}**, seed" if result.level else "Seed") + f" {result.seed}, "
        f"{result.alpha_text()}; {len(result.verdicts)} checks: {counts}. Device {md_text(result.device)}, "
        f"{result.duration_s:.1f} s, {versions}.",
        "",
        md_text(result.budget_text()[0].upper() + result.budget_text()[1:] + "."),
    ]
    ranked = result.ranked_failures()
    if ranked:  # the finding to act on first (``exactcheck.report.ranking``), before any table
        lines += ["", f"**Leading finding**: {inline_code(ranked[0].check)} ({ranked[0].outcome.value}) — "
                  f"{md_text(ranked[0].summary)}"]
    # the checks not run to their budget: one line, as on the terminal, not a row each
    unrun = not_run(result.verdicts)
    rows = [v for v in result.verdicts if v not in unrun]
    folded = md_text(not_run_line(len(unrun), result.stopped_at, result.interrupted)
                     + ("; left out of this table" if rows else "") + " (the JSON report has each).") if unrun else ""
    if rows:
        lines += ["", "| check | outcome | samples | TV (95% interval) | detectable TV | certified TV ≤ | p | "
                  "Holm-adjusted p |", "|---|---|---:|---|---:|---:|---:|---:|"]
    for v in rows:
        tv = "–" if v.tv_estimate is None else (
            f"{v.tv_estimate:.4f} ({v.tv_interval[0]:.4f}–{v.tv_interval[1]:.4f})")
        outcome = v.outcome.value if not v.outcome.failed else f"**{v.outcome.value}**"
        lines.append(f"| {md_cell(v.check)} | {outcome} | {v.samples:,} | {tv} | {_fmt(v.detectable_tv)} | "
                     f"{_fmt(v.tv_certificate)} | {_p(v.pvalue)} | {_p(v.adjusted_pvalue)} |")
    if folded:
        lines += ["", folded]
    deterministic = [v for v in result.verdicts if v.outcome is Outcome.EXACT and not v.kind.statistical
                     and v.kind not in (CheckKind.PROPERTY, CheckKind.INPUTS)]
    if deterministic:
        lines += ["", "Deterministic checks that held:", ""]
        lines += [f"- {inline_code(v.check)} ({md_text(v.condition)}): {md_text(v.summary)}" for v in deterministic]
    failed = rank_failures(v for v in result.verdicts if v.outcome.failed)
    for category in Category:
        found = [v for v in failed if v.category is category]
        if found:
            gating = "" if category.value in result.require else " (not required: reported, not failing)"
            lines += ["", f"## {category.value.capitalize()} findings{gating}", ""]
            for v in found:
                lines += [f"### {md_text(v.check)}", "", fence(v.describe()), ""]
    other = [v for v in result.verdicts if v.outcome in (Outcome.INCONCLUSIVE, Outcome.UNREACHABLE)
             and v not in unrun]
    if other:
        lines += ["", "## Not judged, and unreachable boundary behaviour", ""]
        lines += [f"- {inline_code(v.check)} ({v.outcome.value}): {md_text(v.summary)}" for v in other]
    lines += ["", "TV is the plug-in estimate ½Σ|p̂ − p| (biased upward by sampling noise); "
              "'detectable TV' is the smallest total variation the check finds with power 0.9 at "
              "its α share; 'certified TV ≤' bounds the true TV at confidence 1 − α "
              "(Bretagnolle–Huber–Carol with the least likely cells merged), given for passing checks."]
    return "\n".join(lines) + "\n"


def deterministic_finding(audit) -> "Verdict | None":
    """The first failed property verdict of an audit (a forced-value finding), if any."""
    return next((v for v in audit.failed if v.kind is CheckKind.PROPERTY), None)


def selftest_to_json(result: "SelftestResult") -> dict:
    rows = []
    for name, defect, audit in result.mutants:
        caught = audit.strongest_failure()
        forced = deterministic_finding(audit)
        rows.append({
            "mutant": name, "defect": defect, "detected": not audit.passed,
            "failed_checks": len(audit.failed), "checks": len(audit.verdicts),
            "caught_by": caught.check if caught else None,
            "outcome": caught.outcome.value if caught else None,
            "tv_estimate": caught.tv_estimate if caught else None,
            "adjusted_pvalue": caught.adjusted_pvalue if caught else None,
            "summary": caught.summary if caught else None,
            "category": caught.category.value if caught else None,
            "property": forced.check if forced else None,
            "forced_draws": (len(forced.reproducer["forced_elements"])
                             if forced and forced.reproducer and forced.reproducer.get("forced_elements") is not None
                             else None),
            # how a user meets the finding that caught it (a law: every call), not the first property's
            "reachability": how_reachable(caught) if caught else None,
            "duration_s": round(audit.duration_s, 3),
            "samples_drawn": audit.samples_drawn, "samples_planned": audit.samples_planned,
        })
    return {
        "schema": SELFTEST_SCHEMA, "level": result.level, "seed": result.seed,
        "alpha": result.alpha, "passed": result.passed, "undetected": result.undetected,
        "interrupted": getattr(result, "interrupted", False),
        "mutants_planned": list(getattr(result, "planned", ()) or [r[0] for r in result.mutants]),
        "reference": audit_to_json(result.reference), "mutants": rows,
    }


def render_selftest_markdown(data: dict) -> str:
    ref = data["reference"]
    ref_status = "passes" if ref["summary"]["passed"] else "FAILS"
    lines = [
        f"# exactcheck selftest ({md_text(data['level'])}, seed {md_text(data['seed'])}, α = {data['alpha']:g})",
        "",
        f"The reference verifier {ref_status} all {ref['summary']['checks']} checks "
        f"({ref['duration_s']:.1f} s). "
        f"{sum(r['detected'] for r in data['mutants'])} of {len(data['mutants'])} mutants detected.",
        *(["", f"**INCOMPLETE (interrupted)**: {len(data['mutants'])} of {len(data.get('mutants_planned', ()))} "
               f"mutants audited before the selftest was stopped; this is not a pass."]
          if data.get("interrupted") else []),
        "",
        "| mutant | detected | caught by | category | TV | Holm-adjusted p | property | fewest forced draws | reachability | trials drawn / planned | time |",
        "|---|---|---|---|---:|---:|---|---:|---|---:|---:|",
    ]
    for r in data["mutants"]:
        forced = "–" if r.get("forced_draws") is None else str(r["forced_draws"])
        lines.append(
            f"| {md_cell(r['mutant'])} | {'yes' if r['detected'] else '**NO**'} | {md_cell(r['caught_by'] or '–')} | "
            f"{md_cell(r.get('category') or '–')} | {_fmt(r['tv_estimate'])} | {_p(r['adjusted_pvalue'])} | "
            f"{md_cell(r.get('property') or '–')} | {forced} | {md_cell(r.get('reachability') or '–')} | "
            f"{r.get('samples_drawn', 0):,} / {r.get('samples_planned', 0):,} | {r['duration_s']:.1f} s |")
    lines += ["", "## Mutants", ""]
    lines += [f"- **{md_text(r['mutant'])}**: {md_text(r['defect'])} — {md_text(r['summary'] or 'not detected')}"
              for r in data["mutants"]]
    lines += ["", "## Reference audit", "", render_audit_markdown(ref).split("\n", 2)[2]]
    return "\n".join(lines)


def gate_to_json(results: "list[GateResult]") -> dict:
    """The gate's JSON: every subject with whether it passed, its exemptions, its blocking checks
    and its whole audit."""
    return {
        "schema": GATE_SCHEMA,
        "passed": all(r.passed for r in results) and not any(r.audit.interrupted for r in results),
        "interrupted": any(r.audit.interrupted for r in results),
        "subjects": [{"name": r.subject.name, "kind": r.subject.kind.value, "target": r.subject.target,
                      "passed": r.passed, "exempt": list(r.subject.exempt),
                      "blocking": [v.check for v in r.blocking], "audit": audit_to_json(r.audit)}
                     for r in results],
    }
