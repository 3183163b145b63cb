"""The committed screenshots under reports/, from headless Chromium (Debian's ``chromium``).

    python benchmarks/screenshots.py

* ``reports/html-report-failing-audit.png``: the HTML report of a quick audit of the mutant
  ``bonus_argmax`` (a planted defect: the bonus token is the target's argmax), run to its budget
  on three worlds;
* ``reports/html-report-selftest.png``: the selftest page rendered from the committed
  ``reports/selftest-standard-seed0.json``.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def shoot(chromium: str, page: Path, out: Path, height: int, work: Path) -> None:
    subprocess.run([chromium, *FLAGS, f"--user-data-dir={work / 'profile'}", f"--window-size=1200,{height}",
                    f"--screenshot={out}", page.as_uri()], capture_output=True, timeout=120, check=True)
    print(f"wrote {out.relative_to(ROOT)} ({out.stat().st_size:,} bytes)")


def main() -> int:
    from exactcheck.cli import main as cli
    from exactcheck.report.html import render_selftest_html
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("needs Debian's chromium (apt-get install chromium)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cli(["audit", "exactcheck.step.mutants:bonus_argmax", "--level", "quick", "--world", "three_token",
             "--world", "random_v8_k4", "--world", "ctx_v4_l5_k4", "--no-stop-early", "--report", str(work),
             "--quiet"])
        shoot(chromium, work / "audit-exactcheck-step-mutants-bonus_argmax-quick-seed0.html",
              ROOT / "reports" / "html-report-failing-audit.png", 1600, work)
        page = work / "selftest.html"
        page.write_text(render_selftest_html(json.loads((ROOT / "reports" / "selftest-standard-seed0.json").read_text())))
        shoot(chromium, page, ROOT / "reports" / "html-report-selftest.png", 1500, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
