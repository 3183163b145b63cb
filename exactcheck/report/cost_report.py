"""The cost report: JSON (top-level ``cost`` next to the generator's ``exactness`` verdict),
Markdown and a self-contained HTML page (speedup and fraction slower against draft length, and the
distribution of per-request time ratios)."""
from __future__ import annotations

import html
import math

from exactcheck.report.escaping import inline_code, md_text, terminal_text
from exactcheck.report.html import html_page

__all__ = ["COST_SCHEMA", "render_cost_markdown", "render_cost_html", "cost_headline"]

COST_SCHEMA = "exactcheck.cost/1"


def _x(value, spec=".2f") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _bytes(value) -> str:
    return "–" if value is None else f"{value / 2 ** 20:,.1f} MiB"


def _verdict_line(data: dict) -> str:
    exact = data.get("exactness")
    if not exact:
        return "Exactness: not audited in this run (pass `--exactness`)."
    status = "PASSED" if exact["passed"] else "FAILED"
    failed = ", ".join(inline_code(c) for c in exact.get("failed", [])) or "none"
    lossy = " The generator is **lossy by design**" + (f" (measured TV {exact['tv']:.4f})" if exact.get("tv") else "") + "." \
        if data["generator"].get("lossy") else ""
    return (f"Exactness ({md_text(exact['kind'])} audit, {exact['checks']} checks): **{status}**; failed checks: {failed}."
            f"{lossy}")


def _swept(denominators: dict) -> str:
    lengths = denominators.get("draft_lengths")
    return f", draft length swept over {', '.join(map(str, lengths))}" if lengths else ""


def render_cost_markdown(data: dict) -> str:
    cost, d = data["cost"], data["denominators"]
    s, f, a = cost["speedup"], cost["fraction_slower"], cost["accepted_per_round_mean"]
    verdict = ("**faster** than the target alone" if s["low"] > 1 else "**slower** than the target alone"
               if s["high"] < 1 else "**not distinguishable** from the target alone (the interval spans 1)")
    lines = [
        f"# exactcheck cost of {inline_code(data['generator']['name'])} on {md_text(data['model'])}" + _swept(d),
        "",
        f"Speedup **{s['estimate']:.2f}×** ({s['confidence']:.0%} interval {s['low']:.2f}–{s['high']:.2f}): "
        f"{verdict}. {f['slower']} of {f['requests']} requests were slower than their "
        f"baseline ({f['estimate']:.0%}, interval {f['low']:.0%}–{f['high']:.0%}).",
        "",
        _verdict_line(data),
        "",
        f"Denominators: {md_text(d['time'])}; hardware {md_text(d['hardware'])} ({md_text(d['device'])}), "
        f"precision {md_text(d['precision'])}; prompts of {d['prompt_lengths']} tokens; "
        f"{d['new_tokens']} new tokens per request; policy {md_text(d['policy'])}; torch {md_text(d['torch'])}.",
        "",
    ]
    lines += _table(cost)
    m = cost["peak_memory_bytes"]
    lines += ["", f"Accepted drafts per round, all lengths: {a['estimate']:.2f} ({a['low']:.2f}–{a['high']:.2f}); "
              f"target calls per token: baseline {cost['target_calls_per_token']['baseline']:.2f}, speculative "
              f"{cost['target_calls_per_token']['speculative']:.2f}. Peak memory ({md_text(m['scope'])}): baseline "
              f"{_bytes(m.get('baseline'))}, speculative {_bytes(m.get('speculative'))}. Mean wall time per request: "
              f"baseline {cost['wall_s']['baseline_mean'] * 1e3:.1f} ms (prefill {cost['prefill_s']['baseline_mean'] * 1e3:.1f} ms), "
              f"speculative {cost['wall_s']['speculative_mean'] * 1e3:.1f} ms (prefill "
              f"{cost['prefill_s']['speculative_mean'] * 1e3:.1f} ms)."]
    if data.get("expected_note"):
        lines += ["", md_text(data["expected_note"])]
    lines += ["", f"Methods: speedup — {md_text(s['method'])}; fraction slower — {md_text(f['method'])}; "
              f"accepted per round — {md_text(a['method'])}.", "", f"Reproduce: {inline_code(data['reproduce'])}"]
    return "\n".join(lines) + "\n"


def _table(cost: dict) -> list[str]:
    lines = ["| draft length | requests | speedup (interval) | slower (interval) | accepted / round (interval) | "
             "expected accepted / round | target calls / token | draft calls / token |",
             "|---:|---:|---|---|---|---:|---:|---:|"]
    for row in cost["by_draft_length"]:
        rs, rf, ra = row["speedup"], row["fraction_slower"], row["accepted_per_round_mean"]
        lines.append(f"| {row['draft_length']} | {row['requests']} | {rs['estimate']:.2f} ({rs['low']:.2f}–{rs['high']:.2f}) | "
                     f"{rf['estimate']:.0%} ({rf['low']:.0%}–{rf['high']:.0%}) | {ra['estimate']:.2f} "
                     f"({ra['low']:.2f}–{ra['high']:.2f}) | {_x(row.get('expected_accepted_per_round'), '.3f')} | "
                     f"{row['target_calls_per_token']['speculative']:.2f} | {row['draft_calls_per_token']['speculative']:.2f} |")
    return lines


def _bars(rows: list[dict], key: str, title: str, reference: float, fmt: str, width: int = 460) -> str:
    """One bar per draft length with its interval; a dashed line at ``reference``."""
    height, left, top, bottom = 220, 50, 30, 40
    top_value = 1.15 * max([reference * 1.05] + [r[key]["high"] for r in rows if r[key]["high"] == r[key]["high"]])
    step = (width - left - 10) / max(1, len(rows))
    scale = (height - top - bottom) / (top_value or 1)
    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="{left}" y="18" font-size="13">{html.escape(title)}</text>']
    base_y = height - bottom
    ref_y = base_y - reference * scale
    parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{ref_y:.1f}" y2="{ref_y:.1f}" stroke="#555" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{left - 4}" y="{ref_y + 4:.1f}" font-size="11" text-anchor="end">{format(reference, fmt)}</text>')
    for i, r in enumerate(rows):
        est, low, high = r[key]["estimate"], r[key]["low"], r[key]["high"]
        x = left + i * step + step * 0.2
        w = step * 0.6
        colour = "#1a7f37" if (key == "speedup" and low > 1) else ("#cf222e" if key == "speedup" and high < 1 else "#6e7781")
        if key == "fraction_slower":
            colour = "#cf222e" if low > 0.5 else ("#1a7f37" if high < 0.5 else "#6e7781")
        parts.append(f'<rect x="{x:.1f}" y="{base_y - est * scale:.1f}" width="{w:.1f}" height="{est * scale:.1f}" fill="{colour}"/>')
        cx = x + w / 2
        parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{base_y - high * scale:.1f}" y2="{base_y - low * scale:.1f}" stroke="#000"/>')
        parts.append(f'<text x="{cx:.1f}" y="{base_y + 14}" font-size="11" text-anchor="middle">k={r["draft_length"]}</text>')
        parts.append(f'<text x="{cx:.1f}" y="{base_y - high * scale - 4:.1f}" font-size="11" text-anchor="middle">{format(est, fmt)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _histogram(ratios: list[float], width: int = 460, bins: int = 20) -> str:
    height, left, top, bottom = 220, 40, 30, 40
    logs = [math.log2(r) for r in ratios if r > 0]
    if not logs:
        return ""
    lo, hi = min(logs + [-1.0]), max(logs + [1.0])
    counts = [0] * bins
    for v in logs:
        counts[min(bins - 1, int((v - lo) / (hi - lo) * bins))] += 1
    scale = (height - top - bottom) / max(counts)
    step = (width - left - 10) / bins
    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="per-request time ratios">',
             '<text x="40" y="18" font-size="13">baseline time / speculative time per request (log scale)</text>']
    for i, c in enumerate(counts):
        centre = lo + (i + 0.5) * (hi - lo) / bins
        colour = "#1a7f37" if centre > 0 else "#cf222e"
        parts.append(f'<rect x="{left + i * step:.1f}" y="{height - bottom - c * scale:.1f}" width="{step - 1:.1f}" '
                     f'height="{c * scale:.1f}" fill="{colour}"/>')
    one = left + (0 - lo) / (hi - lo) * (width - left - 10)
    parts.append(f'<line x1="{one:.1f}" x2="{one:.1f}" y1="{top}" y2="{height - bottom}" stroke="#000" stroke-dasharray="4 3"/>')
    for value in (lo, 0.0, hi):
        x = left + (value - lo) / (hi - lo) * (width - left - 10)
        parts.append(f'<text x="{x:.1f}" y="{height - bottom + 14}" font-size="11" text-anchor="middle">{2 ** value:.2g}×</text>')
    parts.append("</svg>")
    return "".join(parts)


def cost_headline(data: dict) -> str:
    """The cost report's verdict in a few plain lines (what ``exactcheck cost`` prints)."""
    return terminal_text("\n".join(render_cost_markdown(data).splitlines()[2:5]).strip().replace("**", ""))


def render_cost_html(data: dict) -> str:
    cost = data["cost"]
    body = [f"<h1>exactcheck cost of <code>{html.escape(data['generator']['name'])}</code> on "
            f"{html.escape(data['model'] + _swept(data['denominators']))}</h1>"]
    body += [f"<p>{html.escape(line.replace('**', ''))}</p>" for line in render_cost_markdown(data).splitlines()[2:5]
             if line]
    rows = cost["by_draft_length"]
    body.append('<div class="plots">' + _bars(rows, "speedup", "speedup against draft length (bar: estimate; line: interval)", 1.0, ".2f")
                + _bars(rows, "fraction_slower", "share of requests slower than the baseline", 0.5, ".0%")
                + _histogram(cost["ratios"]) + "</div>")
    table = [line.strip("|").split(" | ") for line in _table(cost)]
    body.append("<table><tr>" + "".join(f"<th>{html.escape(c.strip())}</th>" for c in table[0]) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in row) + "</tr>"
                          for row in table[2:]) + "</table>")
    body.append(f"<p><small>{html.escape(data['denominators']['time'])}. Reproduce: <code>{html.escape(data['reproduce'])}</code></small></p>")
    return html_page(f"exactcheck cost: {data['generator']['name']}", body)
