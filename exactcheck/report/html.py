"""One self-contained HTML file per audit, and a short Markdown summary for a pull request.

The HTML has no external resources (inline CSS and SVG, one tiny inline script): it opens from a
CI artifact or an e-mail attachment as it is. It shows the verdict table, then plots where
people would rather look than read: expected vs observed law of every failed statistical check,
the accepted-length distributions of the laws judged on enough samples to read
(``MIN_PLOTTED_SAMPLES``), every statistical check's adjusted p-value against alpha, and its
detectable and certified TV; then each finding's full text, the leading one first
(``exactcheck.report.ranking``). Rendered from the JSON report, like the Markdown, so an old
report can be re-rendered.
"""
from __future__ import annotations

import html
import math

from exactcheck.report.escaping import fence, inline_code, md_text
from exactcheck.report.json_md import audit_from_json
from exactcheck.report.ranking import rank_failures
from exactcheck.report.verdict import Outcome, Verdict

__all__ = ["render_audit_html", "render_selftest_html", "render_pr_comment", "html_page", "MIN_PLOTTED_SAMPLES"]

# An accepted-length law is plotted only when it was judged (not inconclusive) on at least this
# many samples: below it, a cell's observed frequency is known only to about ±0.1 (the 95%
# half-width 1.96·sqrt(1/4n) is 0.098 at n = 100), wider than most differences the plot would show.
MIN_PLOTTED_SAMPLES = 100

_COLOURS = {Outcome.EXACT: "#1a7f37", Outcome.DEFECT: "#cf222e", Outcome.CONTRACT_VIOLATION: "#cf222e",
            Outcome.CRASHED: "#8250df", Outcome.INCONCLUSIVE: "#9a6700", Outcome.UNREACHABLE: "#57606a",
            Outcome.LOSSY: "#bc4c00"}

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 24px auto; max-width: 1100px;
       color: #1f2328; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #d0d7de; }
.status { padding: 2px 10px; border-radius: 12px; color: white; font-weight: 600; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed { background: #ffebe9; } tr.inconclusive { background: #fff8c5; }
pre { background: #f6f8fa; padding: 12px; overflow-x: auto; font-size: 12px; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; }
.plot { border: 1px solid #d0d7de; border-radius: 6px; padding: 8px; }
.plot h3 { font-size: 14px; margin: 0 0 4px 0; }
.legend span { margin-right: 12px; font-size: 12px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _num(x, spec=".4f") -> str:
    return "–" if x is None else format(x, spec)


def _p(x) -> str:
    if x is None:
        return "–"
    return "0" if x == 0 else (f"{x:.3g}" if x >= 1e-3 else f"{x:.1e}")


def _nice_ceiling(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``x`` (> 0): an axis's
    top whose half is a round number too."""
    power = 10.0 ** math.floor(math.log10(x))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= x * (1 - 1e-12))


def _tick(value: float) -> str:
    """An axis label: thousands separated, no trailing zeros ("0", "0.5", "2.5", "10,000")."""
    text = f"{value:,.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _bars(verdict: Verdict, width: int = 520, height: int = 220) -> str:
    """Grouped bars: expected (grey) and observed (coloured) counts per cell, on an axis from 0 to
    a round number at or above the largest (ticks at 0, its half and it: three distinct labels)."""
    cells = verdict.law_cells
    top = _nice_ceiling(max(max(c.expected for c in cells), max(c.observed for c in cells), 1e-9))
    left, bottom = 48, 64
    plot_w, plot_h = width - left - 8, height - bottom - 10
    step = plot_w / len(cells)
    bar = max(1.0, step * 0.4)
    colour = _COLOURS[verdict.outcome]
    kind = "law-plot failed-law" if verdict.outcome.failed else "law-plot"
    parts = [f'<svg class="{kind}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="expected vs observed, {_e(verdict.check)}">']
    for frac in (0, 0.5, 1):
        y = 10 + plot_h * (1 - frac)
        parts.append(f'<line x1="{left}" x2="{width - 8}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d0d7de"/>')
        parts.append(f'<text class="tick" x="{left - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
                     f'{_tick(top * frac)}</text>')
    for i, cell in enumerate(cells):
        x = left + i * step + step * 0.1
        for j, (value, fill) in enumerate(((cell.expected, "#8c959f"), (cell.observed, colour))):
            h = plot_h * value / top
            parts.append(f'<rect x="{x + j * bar:.1f}" y="{10 + plot_h - h:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                         f'fill="{fill}"><title>{_e(cell.cell)}: {"expected" if j == 0 else "observed"} '
                         f'{value:,.1f}</title></rect>')
        lx, ly = x + bar, 10 + plot_h + 6
        parts.append(f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="9" text-anchor="end" '
                     f'transform="rotate(-55 {lx:.1f} {ly:.1f})">{_e(cell.cell)[:18]}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _law_plot(verdict: Verdict) -> str:
    low, high = verdict.tv_interval or (None, None)
    tv = "" if verdict.tv_estimate is None else (
        f"TV {verdict.tv_estimate:.4f} (95% {low:.4f}–{high:.4f}), adjusted p {_p(verdict.adjusted_pvalue)}")
    return (f'<div class="plot"><h3>{_e(verdict.check)}: {_e(verdict.outcome.value)}</h3>'
            f'<div class="legend"><span><i class="swatch" style="background:#8c959f"></i>expected (exact law × n)'
            f'</span><span><i class="swatch" style="background:{_COLOURS[verdict.outcome]}"></i>observed</span>'
            f'<span>{_e(tv)}</span></div>{_bars(verdict)}</div>')


def _pvalue_plot(verdicts: list[Verdict], alpha: float, width: int = 1000) -> str:
    """Per statistical check: -log10(adjusted p) (capped at 20) against the -log10(alpha) line,
    and the detectable and certified TV on an axis from 0 to 0.1, or to a round number at or above
    the largest of them (a TV is at most 1), so no bar is cut short."""
    rows = [v for v in verdicts if v.kind.statistical and v.statistic is not None and v.adjusted_pvalue is not None]
    if not rows:
        return ""
    row_h, left = 16, 260
    height = row_h * len(rows) + 40
    half = (width - left - 40) / 2
    cap = 20.0
    tvs = [x for v in rows for x in (v.detectable_tv, v.tv_certificate) if x is not None]
    tv_top = min(1.0, _nice_ceiling(max([0.1, *tvs])))
    parts = [f'<svg class="pvalue-plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<text x="{left}" y="12" font-size="11">−log10(adjusted p), capped at {cap:g}; '
             f'red line: alpha = {alpha:g}</text>',
             f'<text x="{left + half + 40}" y="12" font-size="11">detectable TV (bar) and certified TV ≤ (tick), '
             f'0–{_tick(tv_top)}</text>']
    line_x = left + half * min(cap, -math.log10(alpha)) / cap if alpha > 0 else None
    tv_left = left + half + 40
    for frac, anchor in ((0, "start"), (0.5, "middle"), (1, "end")):  # the TV axis: 0, its half, its top
        x = tv_left + half * frac
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="18" y2="{height - 14}" stroke="#d0d7de"/>'
                     f'<text class="tv-tick" x="{x:.1f}" y="{height - 3}" font-size="10" text-anchor="{anchor}">'
                     f'{_tick(tv_top * frac)}</text>')
    for i, v in enumerate(rows):
        y = 24 + i * row_h
        score = cap if v.adjusted_pvalue == 0 else min(cap, -math.log10(max(v.adjusted_pvalue, 1e-300)))
        colour = _COLOURS[v.outcome]
        parts.append(f'<text x="{left - 6}" y="{y + 10}" font-size="10" text-anchor="end">{_e(v.check)[:40]}</text>')
        parts.append(f'<rect x="{left}" y="{y + 3}" width="{half * score / cap:.1f}" height="{row_h - 6}" '
                     f'fill="{colour}"><title>adjusted p {_p(v.adjusted_pvalue)}</title></rect>')
        if v.detectable_tv is not None:
            w = half * min(v.detectable_tv, tv_top) / tv_top
            parts.append(f'<rect x="{tv_left}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="#54aeff">'
                         f'<title>detectable TV {v.detectable_tv:.4f}</title></rect>')
        if v.tv_certificate is not None:
            x = tv_left + half * min(v.tv_certificate, tv_top) / tv_top
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y + 1}" y2="{y + row_h - 1}" stroke="#1f2328" '
                         f'stroke-width="2"><title>certified TV ≤ {v.tv_certificate:.4f}</title></line>')
    if line_x is not None:
        parts.append(f'<line x1="{line_x:.1f}" x2="{line_x:.1f}" y1="18" y2="{height - 4}" stroke="#cf222e" '
                     'stroke-dasharray="4 3"/>')
    parts.append("</svg>")
    return "".join(parts)


def _row(result, v: Verdict) -> str:
    cls = "failed" if result.gates(v) else ("inconclusive" if v.outcome is Outcome.INCONCLUSIVE else "")
    tv = "–" if v.tv_estimate is None or not v.samples else (
        f"{v.tv_estimate:.4f} ({v.tv_interval[0]:.4f}–{v.tv_interval[1]:.4f})")
    return (f'<tr class="{cls}"><td>{_e(v.check)}</td><td style="color:{_COLOURS[v.outcome]}">'
            f'<b>{_e(v.outcome.value)}</b></td><td class="num">{v.samples:,}</td><td class="num">{tv}</td>'
            f'<td class="num">{_num(v.detectable_tv) if v.samples else "–"}</td>'
            f'<td class="num">{_num(v.tv_certificate) if v.samples else "–"}</td>'
            f'<td class="num">{_p(v.adjusted_pvalue)}</td><td>{_e(v.summary)}</td></tr>')


_TABLE_HEAD = ("<table><tr><th>check</th><th>outcome</th><th>samples</th><th>TV (95% interval)</th>"
               "<th>detectable TV</th><th>certified TV ≤</th><th>adjusted p</th><th>summary</th></tr>")


def _has_samples(v: Verdict) -> bool:
    return bool(v.samples) and any(c.observed for c in v.law_cells)


def render_audit_html(data: dict) -> str:
    """The audit report (an ``exactcheck.audit/1`` JSON dict) as one self-contained HTML page."""
    result = audit_from_json(data)
    title, body = _audit_body(result)
    return html_page(title, body)


def html_page(title: str, body: list[str]) -> str:
    script = ("window.addEventListener('error', function () { document.title = 'exactcheck report: render error'; "
              "document.body.setAttribute('data-rendered', 'error'); });"
              "window.addEventListener('load', function () { if (document.body.getAttribute('data-rendered') "
              "!== 'error') { document.body.setAttribute('data-rendered', 'ok'); } });")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style>"
            f"<script>{script}</script></head><body>" + "\n".join(body) + "</body></html>\n")


def _audit_body(result, heading: str = "h1") -> tuple[str, list[str]]:
    """(title, body parts) of one audit: verdict, failed laws, the checks (inconclusive ones
    folded), p-values, accepted lengths of worlds that drew samples, findings."""
    status = "INCOMPLETE (interrupted)" if result.interrupted else ("PASSED" if result.passed else "FAILED")
    counts = result.counts_text()
    env = result.environment
    head = ((f"level {result.level}, seed" if result.level else "seed") + f" {result.seed}, {result.alpha_text()}"
            + f"; {len(result.verdicts)} checks: {counts}; {result.duration_s:.1f} s; exactcheck "
            f"{env.get('exactcheck')}, torch {env.get('torch')}"
            + (f", transformers {env['transformers']}" if "transformers" in env else ""))
    budget = result.budget_text()[0].upper() + result.budget_text()[1:]
    folded = [v for v in result.verdicts if v.outcome is Outcome.INCONCLUSIVE and not result.gates(v)]
    rows = [_row(result, v) for v in result.verdicts if v not in folded]
    failed_plots = [_law_plot(v) for v in result.verdicts if v.outcome.failed and _has_samples(v)]
    lengths = [v for v in result.verdicts if v.law == "accepted_length" and not v.outcome.failed]
    readable = [v for v in lengths if _has_samples(v) and v.outcome is not Outcome.INCONCLUSIVE
                and v.samples >= MIN_PLOTTED_SAMPLES]
    length_plots = [_law_plot(v) for v in readable]
    ranked = rank_failures(v for v in result.verdicts if v.outcome.failed)
    findings = [f"<h3>{_e(v.check)} <small>({_e(v.category.value)}"
                f"{'' if result.gates(v) or not v.outcome.failed else ', not required'})</small></h3>"
                f"<pre>{_e(v.describe())}</pre>"
                for v in ranked + [v for v in result.verdicts if v.outcome is Outcome.UNREACHABLE]]
    leading = result.ranked_failures()
    sub = "h2" if heading == "h1" else "h3"
    body = [
        f'<{heading}>exactcheck {_e(result.command)} <code>{_e(result.subject)}</code> '
        f'<span class="status" style="background:{"#1a7f37" if result.passed else "#cf222e"}">{status}</span></{heading}>',
        f"<p>{_e(head)}.</p><p>{_e(budget)}.</p>",
    ]
    if leading:  # the finding to act on first, before any plot or table
        body.append(f'<p id="leading-finding"><b>Leading finding</b>: <code>{_e(leading[0].check)}</code> '
                    f"({_e(leading[0].outcome.value)}) — {_e(leading[0].summary)}</p>")
    if failed_plots:
        body += [f"<{sub}>Expected vs observed law of the failed checks</{sub}>",
                 f'<div class="plots" id="failed-law-plots">{"".join(failed_plots)}</div>']
    body += [f"<{sub}>Checks</{sub}>", _TABLE_HEAD, "".join(rows), "</table>"]
    if folded:
        one = len(folded) == 1
        body += [f'<details id="inconclusive"><summary>{len(folded)} inconclusive check{"" if one else "s"} '
                 f'(not run to {"its" if one else "their"} budget, or not judged; '
                 f'{"it did not pass" if one else "none of them passed"})</summary>', _TABLE_HEAD,
                 "".join(_row(result, v) for v in folded), "</table></details>"]
    pvalues = _pvalue_plot([v for v in result.verdicts if v.samples], result.alpha or 0.0)
    if pvalues:
        body += [f"<{sub}>p-values, detectable TV and certificates</{sub}>", pvalues]
    if lengths:
        left_out = len(lengths) - len(readable)
        rule = (f"A law is plotted only when it was judged (not inconclusive) on at least {MIN_PLOTTED_SAMPLES} "
                "samples: with fewer, a cell's frequency is known only to about ±0.1 (95%)."
                + (f" {left_out} of {len(lengths)} left out." if left_out else ""))
        body += [f"<{sub}>Accepted-length distributions</{sub}>", f"<p>{_e(rule)}</p>"]
        if length_plots:
            body.append(f'<div class="plots" id="length-plots">{"".join(length_plots)}</div>')
    if findings:
        body += [f"<{sub}>Findings</{sub}>", *findings]
    body.append("<p><small>TV is the plug-in estimate ½Σ|p̂ − p|; detectable TV is the TV the check finds 9 times "
                "in 10 at its α share and sample size (a defect smaller than that can still be found, with lower "
                "probability); certified TV ≤ bounds the true TV at confidence 1 − α. A check with no samples "
                "shows –.</small></p>")
    return f"{result.title()}: {status}", body


def render_pr_comment(data: dict, most: int = 10) -> str:
    """A short Markdown summary for a pull-request comment: status, counts, the failed checks.
    What comes from the subject (its name, check names, reproduce lines, exception text) is
    escaped (``exactcheck.report.escaping``): it cannot close the finding's fence or inject markup."""
    result = audit_from_json(data)
    failed = result.ranked_failures()
    icon = "✅" if result.passed else "❌"
    lines = [f"### {icon} exactcheck {result.command}: {inline_code(result.subject)} "
             f"{'passes' if result.passed else 'FAILS'}", "",
             f"{len(result.verdicts)} checks ({result.counts_text()}); {md_text(result.settings_text())}."]
    if failed:
        lines += ["", "| check | outcome | TV (95% interval) | adjusted p | reproduce |", "|---|---|---|---:|---|"]
        for v in failed[:most]:
            tv = "–" if v.tv_estimate is None else (
                f"{v.tv_estimate:.4f} ({v.tv_interval[0]:.4f}–{v.tv_interval[1]:.4f})")
            lines.append(f"| {inline_code(v.check, table=True)} | {v.outcome.value} | {tv} | {_p(v.adjusted_pvalue)} | "
                         f"{inline_code(v.reproduce, table=True)} |")
        if len(failed) > most:
            lines.append(f"| … {len(failed) - most} more | | | | |")
        lines += ["", "<details><summary>strongest finding</summary>", "", fence(failed[0].describe()), "",
                  "</details>"]
    if result.not_required:
        lines += ["", "Non-gating findings (reported, not failing): " + ", ".join(
            f"{inline_code(v.check)} ({v.category.value}; `--require {v.category.flag}` makes it fail)"
            for v in result.not_required)]
    return "\n".join(lines) + "\n"


def render_selftest_html(data: dict) -> str:
    """The selftest report (an ``exactcheck.selftest/1`` JSON dict) as one self-contained page:
    the mutant table (caught by, category, TV, reachability), then the reference's own audit
    with its checks, certificates and accepted-length laws."""
    reference = audit_from_json(data["reference"])
    mutants = data["mutants"]
    detected = sum(r["detected"] for r in mutants)
    passed = reference.passed and detected == len(mutants) and not data.get("interrupted")
    status = "INCOMPLETE (interrupted)" if data.get("interrupted") else "PASSED" if passed else "FAILED"
    rows = []
    for r in mutants:
        forced = "–" if r.get("forced_draws") is None else str(r["forced_draws"])
        rows.append(f'<tr class="{"" if r["detected"] else "failed"}"><td title="{_e(r["defect"])}">{_e(r["mutant"])}</td>'
                    f'<td><b>{"detected" if r["detected"] else "MISSED"}</b></td><td>{_e(r["caught_by"] or "–")}</td>'
                    f'<td>{_e(r.get("category") or "–")}</td><td class="num">{_num(r["tv_estimate"])}</td>'
                    f'<td class="num">{_p(r["adjusted_pvalue"])}</td><td class="num">{forced}</td>'
                    f'<td>{_e(r.get("reachability") or "–")}</td>'
                    f'<td class="num">{r.get("samples_drawn", 0):,} / {r.get("samples_planned", 0):,}</td>'
                    f'<td class="num">{r["duration_s"]:.1f}&nbsp;s</td></tr>')
    body = [
        f'<h1>exactcheck selftest <span class="status" style="background:{"#1a7f37" if passed else "#cf222e"}">'
        f'{status}</span></h1>',
        f"<p>level {_e(data['level'])}, seed {_e(data['seed'])}, α = {data['alpha']:g} per audit. The reference "
        f"verifier {'passes' if reference.passed else 'FAILS'} all {len(reference.verdicts)} checks; "
        f"{detected} of {len(mutants)} deliberately broken verifiers are detected.</p>",
        "<h2>Mutants</h2>",
        "<table><tr><th>mutant</th><th>result</th><th>caught by</th><th>category</th><th>TV</th>"
        "<th>adjusted p</th><th>fewest forced draws</th><th>reachability</th><th>trials drawn / planned</th>"
        "<th>time</th></tr>", "".join(rows), "</table>",
        "<h3>The defect planted in each mutant</h3><ul>"
        + "".join(f"<li><b>{_e(r['mutant'])}</b>: {_e(r['defect'])}</li>" for r in mutants) + "</ul>",
        "<h2>The reference verifier</h2>",
    ]
    _, reference_body = _audit_body(reference, heading="h3")
    return html_page(f"exactcheck selftest {status}", body + reference_body)
