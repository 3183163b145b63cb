"""The served cost report (``exactcheck cost URL --reference URL2``; measured by
``exactcheck.cost.served``): Markdown and a self-contained HTML page (every request's latency in the
order sent, both servers, and the ratio per setting with its interval), both rendered from the JSON.
Everything a server said (its URL, its declared settings, its error) is data, escaped."""
from __future__ import annotations

import html
import math

from exactcheck.report.escaping import inline_code, md_cell, md_text, terminal_text
from exactcheck.report.html import html_page

__all__ = ["SERVED_COST_SCHEMA", "render_served_cost_markdown", "render_served_cost_html", "served_cost_headline"]

SERVED_COST_SCHEMA = "exactcheck.served-cost/1"
_ROLES = ("audited", "reference")


def _number(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _est(e: dict | None, scale: float = 1.0, spec: str = ".1f") -> str:
    """'12.3 (11.0–13.5)'; '–' where there is no figure, the interval left out where there is none."""
    value = _number((e or {}).get("estimate"))
    if value is None:
        return "–"
    low, high = _number(e.get("low")), _number(e.get("high"))
    text = format(value * scale, spec)
    if low is not None and high is not None:
        text += f" ({format(low * scale, spec)}–{format(high * scale, spec)})"
    return text


def _verdict(ratio: dict) -> str:
    low, high = _number(ratio.get("low")), _number(ratio.get("high"))
    if low is None or high is None:
        return "no interval (too few pairs)"
    if high < 1:
        return "the audited server is **faster**"
    if low > 1:
        return "the audited server is **slower**"
    return "**not distinguishable** (the interval spans 1)"


def _stopped(data: dict) -> list[str]:
    stop = data.get("stopped")
    if not stop:
        return []
    s = data["settings"]
    kept = f"{s['complete_pairs']} of {s['planned_pairs']} planned pairs complete, measured below"
    if stop.get("reason") == "interrupted":
        return [f"**Incomplete**: interrupted after {stop['answered']} timed requests; {kept}.", ""]
    lines = [f"**Stopped early**: the {md_text(stop['role'])} server {inline_code(stop['server'])} stopped answering "
             f"after {stop['answered']} timed requests ({md_text(stop['error'])}); {kept}."]
    if stop.get("requests"):
        lines.append(f"The request in flight, to send again: {inline_code(stop['requests'][0])}")
    return lines + [""]


def _speculation(role: str, spec: dict) -> str:
    if spec.get("source") is None:
        return f"{role}: no counter reported (the API exposes none, or the server drafted on none of the requests)"
    rate = spec.get("acceptance")
    on = "" if spec.get("requests_drafting") is None else f", drafting on {spec['requests_drafting']} requests"
    return (f"{role}: {spec['drafted']:,} tokens drafted, {spec['accepted']:,} accepted (acceptance "
            f"{_est(rate, spec='.3f')}{on}; {md_text(spec['source'])})")


def _rows(summary: dict) -> list[str]:
    lines = ["| setting | pairs | server | median latency, ms (interval) | mean latency, ms (interval) | "
             "output tokens/s (interval) | drafted | accepted | acceptance (interval) |",
             "|---|---:|---|---|---|---|---:|---:|---|"]
    for group in [summary["all"]] + summary["by_setting"]:
        for role in _ROLES:
            r, spec = group[role], group[role]["speculation"]
            lines.append(f"| {md_cell(group['setting'])} | {group['pairs']} | {role} | "
                         f"{_est(r['latency_median_s'], 1e3)} | {_est(r['latency_mean_s'], 1e3)} | "
                         f"{_est(r['tokens_per_s'])} | {_count(spec.get('drafted'))} | "
                         f"{_count(spec.get('accepted'))} | {_est(spec.get('acceptance'), spec='.3f')} |")
    return lines


def _count(value) -> str:
    return "–" if value is None else f"{value:,}"


def _ratios(summary: dict) -> list[str]:
    lines = ["| setting | pairs | latency audited / reference (interval) | tokens/s audited / reference (interval) | "
             "audited slower | identical outputs |", "|---|---:|---|---|---:|---:|"]
    for group in [summary["all"]] + summary["by_setting"]:
        lines.append(f"| {md_cell(group['setting'])} | {group['pairs']} | {_est(group['latency_ratio'], spec='.3f')} | "
                     f"{_est(group['throughput_ratio'], spec='.3f')} | {group['audited_slower']} of {group['pairs']} | "
                     f"{group['identical_outputs']} of {group['pairs']} |")
    return lines


def _ratio(ratio: dict) -> str:
    """'**0.620×** (95% interval 0.580–0.660'; no interval where there is none."""
    est, low, high = (_number(ratio.get(k)) for k in ("estimate", "low", "high"))
    if est is None:
        return "**–** (no figure"
    text = f"**{est:.3f}×** ("
    if low is not None and high is not None:
        text += f"{_number(ratio.get('confidence')) or 0.95:.0%} interval {low:.3f}–{high:.3f}, "
    return text


def _head(data: dict) -> list[str]:
    servers, overall = data["servers"], data["summary"]["all"]
    if not overall["pairs"]:
        return [f"No pair was measured on both servers ({inline_code(servers['audited']['url'])}, "
                f"{inline_code(servers['reference']['url'])}).", ""]
    ratio, rate = overall["latency_ratio"], overall["throughput_ratio"]
    return [f"Latency audited / reference {_ratio(ratio)}{overall['pairs']} paired requests): {_verdict(ratio)}. "
            f"Output tokens/s audited / reference {_est(rate, spec='.3f')}: audited "
            f"{_est(overall['audited']['tokens_per_s'])}, reference {_est(overall['reference']['tokens_per_s'])}. "
            f"The audited server was slower in {overall['audited_slower']} of {overall['pairs']} pairs.", ""]


def render_served_cost_markdown(data: dict) -> str:
    servers, s, summary = data["servers"], data["settings"], data["summary"]
    lines = [f"# exactcheck cost of the served system {inline_code(servers['audited']['url'])} against "
             f"{inline_code(servers['reference']['url'])} (speculation off)", ""]
    lines += _head(data) + _stopped(data)
    lines += ["Speculation counters, " + "; ".join(_speculation(role, summary["all"][role]["speculation"])
                                                   for role in _ROLES) + ".", ""]
    lines += _rows(summary) + [""] + _ratios(summary) + [""]
    prompts = ", ".join(f"{len(p)} tokens" for p in s["prompts"])
    lines += [f"Requests: {s['requests_per_setting']} per setting ({md_text('; '.join(s['samplings']))}), "
              f"{s['new_tokens']} new tokens each, prompts of {prompts}, seed {s['seed']}; the same prompt, sampling, "
              f"seed and length to both servers. Order: {md_text(data['order'])}.", "",
              f"Time: {md_text(data['denominators']['time'])}. Time-out {s['timeout_s']:g} s per request, at most "
              f"{s['retries']} retries (retried: audited {summary['all']['audited']['retried']}, reference "
              f"{summary['all']['reference']['retried']}). Client: {md_text(data['denominators']['client'])}, "
              f"load average {_load(data['denominators'].get('load_average'))} (1 minute, before and after), Python "
              f"{md_text(data['denominators']['python'])}, exactcheck {md_text(data['denominators']['exactcheck'])}; "
              f"{md_text(data['traffic'])}.", "",
              f"Endpoints: audited {md_text(servers['audited']['endpoint'])}; reference "
              f"{md_text(servers['reference']['endpoint'])}. Declared speculation settings: "
              + "; ".join(f"{role} {inline_code(_settings(servers[role]['declared_settings']))}" for role in _ROLES)
              + ".", "",
              f"Methods: latency median — {md_text(summary['all']['audited']['latency_median_s']['method'])}; "
              f"mean — {md_text(summary['all']['audited']['latency_mean_s']['method'])}; ratio — "
              f"{md_text(summary['all']['latency_ratio']['method'])}. Identical outputs are counted, not judged "
              f"(the same seed need not give the same tokens under speculation): {inline_code('exactcheck serve')} "
              f"judges exactness.", "",
              f"Reproduce: {inline_code(data['reproduce'])}"]
    return "\n".join(lines) + "\n"


def _load(values) -> str:
    if not isinstance(values, list) or not values:
        return "not recorded"
    return " and ".join(f"{v:.2f}" if isinstance(v, (int, float)) else "–" for v in values)


def _settings(declared: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in declared.items()) if declared else "none exposed"


def served_cost_headline(data: dict) -> str:
    """The served cost in a few plain lines (what ``exactcheck cost URL`` prints)."""
    lines = _head(data) + _stopped(data)
    if data["summary"]["all"]["pairs"]:
        counters = data["summary"]["all"]["audited"]["speculation"]
        lines.append("Speculation counters, " + _speculation("audited", counters) + ".")
    return terminal_text("\n".join(line for line in lines if line).replace("**", ""))


def _timeline(records: list[dict], width: int = 560, height: int = 240) -> str:
    """Every timed request's latency in the order sent: the audited server's and the reference's."""
    left, top, bottom, right = 56, 30, 36, 10
    if not records:
        return ""
    highest = max(r["latency_s"] for r in records) * 1.1 or 1.0
    count = max(r["order"] for r in records) + 1
    x = lambda order: left + (width - left - right) * (order + 0.5) / count  # noqa: E731
    y = lambda seconds: height - bottom - (height - top - bottom) * seconds / highest  # noqa: E731
    colours = {"audited": "#1a7f37", "reference": "#6e7781"}
    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="latency per request in the order sent">',
             '<text x="56" y="18" font-size="13">latency per request, in the order sent (ms)</text>',
             f'<line x1="{left}" x2="{left}" y1="{top}" y2="{height - bottom}" stroke="#555"/>',
             f'<line x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}" stroke="#555"/>',
             f'<text x="{left - 4}" y="{top + 4}" font-size="11" text-anchor="end">{highest * 1e3:.0f}</text>',
             f'<text x="{left - 4}" y="{height - bottom}" font-size="11" text-anchor="end">0</text>']
    for r in records:
        parts.append(f'<circle cx="{x(r["order"]):.1f}" cy="{y(r["latency_s"]):.1f}" r="2.5" '
                     f'fill="{colours.get(r["server"], "#000")}"/>')
    for i, (role, colour) in enumerate(colours.items()):
        parts.append(f'<rect x="{left + 10 + i * 110}" y="{height - 16}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{left + 24 + i * 110}" y="{height - 7}" font-size="11">{role}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _ratio_bars(groups: list[dict], width: int = 460, height: int = 240) -> str:
    """The latency ratio per setting with its interval, a dashed line at 1."""
    left, top, bottom = 50, 30, 40
    rows = [g for g in groups if _number(g["latency_ratio"].get("estimate")) is not None]
    if not rows:
        return ""
    highest = 1.15 * max([1.05] + [_number(g["latency_ratio"].get("high")) or g["latency_ratio"]["estimate"]
                                   for g in rows])
    scale = (height - top - bottom) / highest
    step = (width - left - 10) / len(rows)
    base = height - bottom
    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="latency ratio per setting">',
             '<text x="50" y="18" font-size="13">latency audited / reference per setting (bar: estimate; line: '
             'interval)</text>',
             f'<line x1="{left}" x2="{width - 10}" y1="{base - scale:.1f}" y2="{base - scale:.1f}" stroke="#555" '
             f'stroke-dasharray="4 3"/>',
             f'<text x="{left - 4}" y="{base - scale + 4:.1f}" font-size="11" text-anchor="end">1</text>']
    for i, g in enumerate(rows):
        r = g["latency_ratio"]
        est, low, high = r["estimate"], _number(r.get("low")), _number(r.get("high"))
        colour = "#1a7f37" if high is not None and high < 1 else "#cf222e" if low is not None and low > 1 else "#6e7781"
        bx, w = left + i * step + step * 0.2, step * 0.6
        parts.append(f'<rect x="{bx:.1f}" y="{base - est * scale:.1f}" width="{w:.1f}" height="{est * scale:.1f}" '
                     f'fill="{colour}"/>')
        if low is not None and high is not None:
            parts.append(f'<line x1="{bx + w / 2:.1f}" x2="{bx + w / 2:.1f}" y1="{base - high * scale:.1f}" '
                         f'y2="{base - low * scale:.1f}" stroke="#000"/>')
        parts.append(f'<text x="{bx + w / 2:.1f}" y="{base + 14}" font-size="11" text-anchor="middle">'
                     f'{html.escape(g["setting"][:28])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_served_cost_html(data: dict) -> str:
    servers, summary = data["servers"], data["summary"]
    title = f"exactcheck cost of the served system {servers['audited']['url']}"
    body = [f"<h1>exactcheck cost of the served system <code>{html.escape(servers['audited']['url'])}</code> against "
            f"<code>{html.escape(servers['reference']['url'])}</code> (speculation off)</h1>"]
    body += [f"<p>{html.escape(line.replace('**', ''))}</p>" for line in _head(data) + _stopped(data) if line]
    body.append('<div class="plots">' + _timeline(data["records"]) + _ratio_bars(summary["by_setting"]) + "</div>")
    for table in (_rows(summary), _ratios(summary)):
        cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in table]
        body.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cells[0]) + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                              for row in cells[2:]) + "</table>")
    body.append(f"<p><small>Order: {html.escape(data['order'])}. Time: {html.escape(data['denominators']['time'])}. "
                f"Reproduce: <code>{html.escape(data['reproduce'])}</code></small></p>")
    return html_page(title, body)
