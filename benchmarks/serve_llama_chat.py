"""The chat audit (`exactcheck serve URL --message ...`) against the real llama-server at quick: a
speculating server's /v1/chat/completions (draft model, probabilistic drafts) against the target alone,
through the command with `--report`; then, for the figures of docs/serving.md, the target's chat
endpoint against itself and the `chat_hotter` proxy in front of it. Both servers load a chat template in
the tiny GGUF's vocabulary (`--jinja --chat-template-file`). Needs `bash .ci/llama-server` and `gguf`.
Writes reports/serve-llama-chat.json and .md (the command's own report files, copied).

    python benchmarks/serve_llama_chat.py
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "property_tests")]

from exactcheck.cli import main as exactcheck  # noqa: E402
from exactcheck.endpoints.endpoint import Sampling  # noqa: E402
from exactcheck.serve.mutants import proxy  # noqa: E402
from exactcheck.serve.runner import run_serve_audit  # noqa: E402
from serve_fixtures import llama_server  # noqa: E402
from exactcheck.serve.chat import ChatPrompt  # noqa: E402
from toy_models.gguf_models import ROLE_CHAT_TEMPLATE, write_pair  # noqa: E402

CHAT = ChatPrompt.parse(["system:be brief", "user:Once upon a time"])
SAMPLINGS = ("temperature=1", "temperature=0.7,top_k=8,top_p=0.95,min_p=0.05")


def _rate(result, seconds: float) -> float:
    return int(result.traffic.split(" requests")[0].replace(",", "")) / seconds


def main() -> int:
    pair = write_pair(seed=0)
    work = Path(tempfile.mkdtemp(prefix="exactcheck-chat-"))
    template = work / "chat.jinja"
    template.write_text(ROLE_CHAT_TEMPLATE)
    chat_args = ("--jinja", "--chat-template-file", str(template))
    messages = [flag for spec in CHAT.specs() for flag in ("--message", spec)]
    with llama_server(pair[0], extra_args=chat_args) as target:
        with llama_server(pair[0], draft=pair[1], draft_sampling="probabilistic", draft_max=3,
                          extra_args=chat_args) as speculating:
            begun = time.perf_counter()
            code = exactcheck(["serve", speculating, "--reference", target, *messages, "--n-probs", "64",
                               "--level", "quick", "--report", str(work / "report"), "--quiet"]
                              + [flag for s in SAMPLINGS for flag in ("--sampling", s)])
            print(f"speculating server's chat endpoint against the target: exit {code} in "
                  f"{time.perf_counter() - begun:.1f} s", flush=True)
        audit = dict(level="quick", seed=0, progress=False, prompts=(CHAT,), n_probs=64,
                     samplings=tuple(Sampling.parse(s) for s in SAMPLINGS))
        for name, url_of in (("target against itself", None), ("chat_hotter proxy", "chat_hotter")):
            begun = time.perf_counter()
            if url_of is None:
                result = run_serve_audit(target, **audit)
            else:
                with proxy(url_of, target) as p:
                    result = run_serve_audit(p.url, reference=target, **audit)
            seconds = time.perf_counter() - begun
            print(f"{name}: {'passed' if result.passed else 'FAILED'} in {seconds:.1f} s, "
                  f"{_rate(result, seconds):.0f} requests/s; {result.traffic}")
            for v in result.verdicts:
                print(f"  {v.check}: {v.outcome.value}: {v.summary[:200]}")
    for suffix in ("json", "md"):
        (found,) = (work / "report").glob(f"*.{suffix}")
        shutil.copyfile(found, ROOT / "reports" / f"serve-llama-chat.{suffix}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
