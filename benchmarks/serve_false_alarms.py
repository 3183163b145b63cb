"""False alarms of the serve audit on exact served systems, over many seeds.

The toy served model (``toy_models.served_lm``) speculates losslessly (rejection sampling with the
exact residual), so every finding of the audit on it is a false alarm. Each seed is one whole
quick serve audit (root seed = the seed) of one exact path: continuation laws and speculation_ran
tests under Holm at alpha, and the deterministic checks (logprob fidelity, seed reproducibility,
greedy identity). Three paths take turns by seed:

- ``draft-model``: drafts from a draft table at every step (llama.cpp's API, counters per request);
- ``ngram-rare``: prompt lookup (n-gram 1) over a 64-token vocabulary, which drafts on about 5% of
  the requests at temperature 1 and on none at temperature 0.7 / top-k 5 (llama.cpp's API);
- ``ngram-rare-vllm``: the same through vLLM's dialect (server-wide ``/metrics`` counters).

The new worlds (``--paths new``), each speculating from a draft table, answers through a transport
that turns a 4xx into the error HTTP gives (so ``auto`` detects the dialect as over HTTP):

- ``mlx-lm``: mlx-lm's dialect (text prompts read by the word-level tokenizer of
  ``toy_models.hf_served_models.write_llama``, vocabulary 64; ids from ``logprobs.content``; raw top-11
  lists; answers that stop on the end-of-text token), prompt ``w5 w6 w7``, temperature 1 and
  temperature 0.7 / top-k 8 (the settings of ``property_tests/serve/test_serve_mlx.py``);
- ``chat-llama``: a chat world (``system:be brief``, ``user:abc``) through llama.cpp's chat dialect
  (``/apply-template`` + ``/tokenize``, ids in ``logprobs.content``, ``timings`` per answer);
- ``chat-vllm``: the same conversation through vLLM's (``/tokenize`` with messages,
  ``return_token_ids``, ``/metrics`` counters).

Answers come in-process (``Client(transport=...)``: the same endpoint code, no HTTP), so hundreds
of audits fit a CI-sized machine. Writes reports/serve-false-alarms.json (the first three paths) or
reports/serve-false-alarms-new-worlds.json (``--paths new``).

    python benchmarks/serve_false_alarms.py --seeds 300 [--jobs 2]
    python benchmarks/serve_false_alarms.py --paths new --seeds 201 --jobs 1
    python benchmarks/serve_false_alarms.py --paths penalties --seeds 200 --jobs 1
    python benchmarks/serve_false_alarms.py --paths stops --seeds 200 --jobs 1

``--paths bpe`` (issue 69): the text-prompt dialects over a byte-level BPE tokenizer
(``toy_models.bpe_models``: 320 ids, 132 sharing their text), prompts as text, each path its own
reference: ``mlx-lm-bpe`` (draft-model speculation; temperature 1, temperature 0.7 / top-k 8),
``mlx-lm-bpe-penalties`` (``--server-setting prompt_cache=off``; repetition 1.3, and temperature 0.7 /
top-k 8 with presence and frequency 0.5, on a prompt that repeats) and ``llama-cpp-python-bpe``
(prompt-lookup speculation, ids read from logprob texts, the whole vocabulary asked; temperature 1,
and presence and frequency 0.5). Writes reports/serve-false-alarms-bpe.json.

``--paths traffic`` (issue 67): the traffic users send, each audit under the default mixed traffic (up to
4 in flight), a quarter of each world's requests streamed, an unseeded world, and answers that may end on
the toy's end-of-generation token: ``traffic-llama`` (the ``-ends`` world the audit adds,
its id read from ``/props``) and ``traffic-vllm`` (a world with ``ignore_eos=0,min_tokens=2``, the id
declared with ``eos_ids``), each capped at 1,000 sampled requests a world. Writes reports/serve-false-alarms-traffic.json with the p-values of the new
statistical checks (streamed, concurrent_requests).

``--paths constrained`` (issue 68): structured output, under the default mixed traffic (up to 4 in
flight): ``constrained-llama`` (GBNF written by the audit for a choice and a regex, the check-then-resample
order) and ``constrained-vllm`` (``structured_outputs``), each world ``choice=ab|ba|cab|bb`` and
``temperature=0.7,top_k=5,regex=[a-c]{2,5}``, 4 tokens, answers ending at the end of generation (id 5),
600 sampled requests a world. Writes reports/serve-false-alarms-constrained.json. ``--paths grammar``:
``grammar-llama``, two GBNF grammar worlds (one at temperature 0.7 / top-k 5) through llama.cpp's
dialect, 5 tokens; reports/serve-false-alarms-grammar.json. ``--paths schema``: ``schema-llama`` and
``schema-vllm``, two JSON-schema worlds (an enum, the toy writes it bare) judged by the two-sample test
against a separate reference (the plain toy), 600 answers a side; reports/serve-false-alarms-schema.json.

``--paths stops``: stop-string worlds (``stops-llama``, ``stops-vllm``: prompt ``1 2``, stops "b" or
"cd" at temperature 1, "a" at temperature 0.7 / top-k 5) through llama.cpp's and vLLM's dialects,
speculating from the draft table.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactcheck.serve.chat import ChatPrompt  # noqa: E402
from exactcheck.endpoints.client import EndpointError  # noqa: E402
from exactcheck.endpoints.endpoint import Sampling  # noqa: E402
from exactcheck.serve.runner import run_serve_audit  # noqa: E402
from toy_models.served_lm import ToyServedModel, respond  # noqa: E402

SAMPLINGS = (Sampling(), Sampling(temperature=0.7, top_k=5, min_p=0.05))
RARE = dict(vocab=64, sharpness=1.0, drafter="ngram", ngram=1)
PATHS = {"draft-model": (dict(), "auto"), "ngram-rare": (RARE, "auto"), "ngram-rare-vllm": (dict(RARE, api="vllm"), "openai")}
# the new worlds: (model fields, api, prompts, samplings); answers through ``http_like``
CHAT = ChatPrompt.parse(["system:be brief", "user:abc"])
MLX_SAMPLINGS = (Sampling(), Sampling(temperature=0.7, top_k=8))
NEW_PATHS = {"mlx-lm": (dict(vocab=64, api="mlx-lm"), "auto", ((5, 6, 7),), MLX_SAMPLINGS),
             "chat-llama": (dict(), "auto", (CHAT,), SAMPLINGS),
             # raw probabilities: min-p at temperature 0.7 is not judged from a raw list, top-k is
             "chat-vllm": (dict(api="vllm"), "openai", (CHAT,), (Sampling(), Sampling(temperature=0.7, top_k=5)))}
# penalty worlds (issue 59): a prompt that repeats, so each penalty matters from the first position; the
# toy applies each engine's convention exactly, drafting from its draft model
REPEATS = ((7, 9, 7, 9, 7),)
NEW_PATHS.update({
    # llama.cpp: post-sampling probabilities after its penalties, taken as they are
    "penalty-llama": (dict(), "auto", REPEATS, (Sampling(repetition_penalty=1.5, repeat_last_n=8),
                                               Sampling(temperature=0.7, top_k=5, repetition_penalty=1.3,
                                                        presence_penalty=0.5, frequency_penalty=0.5))),
    # vLLM, raw log-probabilities: presence and frequency applied over the continuation by the audit
    "penalty-vllm": (dict(api="vllm"), "openai", REPEATS, (Sampling(presence_penalty=0.5, frequency_penalty=1.0),
                                                           Sampling(temperature=0.7, top_k=5, frequency_penalty=0.8)))})
PENALTY_PATHS = ("penalty-llama", "penalty-vllm")
# stop-string worlds (issue 59): the toy's token texts are its letters, so "b" and "cd" end answers
# at their first or second token; the law cut at the first stop, the text read as each engine searches it
STOPS = (Sampling.parse("stop=b,stop=cd"), Sampling.parse("temperature=0.7,top_k=5,stop=a"))
NEW_PATHS.update({"stops-llama": (dict(), "auto", ((1, 2),), STOPS),
                  "stops-vllm": (dict(api="vllm"), "openai", ((1, 2),), STOPS)})
STOP_PATHS = ("stops-llama", "stops-vllm")
# byte-level BPE worlds (issue 69): the text-prompt dialects over toy_models.bpe_models' tokenizer (320 ids, 132 of
# them sharing their text with another), prompts as text; prefixes with no text that reads back as their ids pooled,
# llama-cpp-python's shared texts merged: (model fields, api, prompts, samplings, further run_serve_audit settings)
BPE_PROMPT, BPE_REPEATS = ("Once upon a time",), ("one, two, one, two,",)
BPE_PATHS = {
    # draft-model speculation (the toy's exact rejection sampling), the audited server as its own reference
    "mlx-lm-bpe": (dict(api="mlx-lm"), "auto", BPE_PROMPT, (Sampling(), Sampling(temperature=0.7, top_k=8)), {}),
    # penalties judged under the operator's declaration that the prompt cache is off
    "mlx-lm-bpe-penalties": (dict(api="mlx-lm"), "auto", BPE_REPEATS,
                             (Sampling(repetition_penalty=1.3), Sampling(temperature=0.7, top_k=8, presence_penalty=0.5,
                                                                         frequency_penalty=0.5)),
                             dict(server_settings=("prompt_cache=off",))),
    # prompt lookup (llama-cpp-python's only speculation), logprob texts read back as ids, the whole vocabulary asked
    "llama-cpp-python-bpe": (dict(api="llama-cpp-python", drafter="ngram", ngram=1), "auto", BPE_REPEATS,
                             (Sampling(), Sampling(presence_penalty=0.5, frequency_penalty=0.5)), dict(n_probs=320)),
}
# the traffic users send (issue 67): the default mixed traffic, up to 4 in flight, a quarter of each world's
# requests streamed, an unseeded world, and answers that may end on the toy's end-of-generation token (id 5:
# about a third of 3-token answers at sharpness 1 end on it): llama.cpp's dialect with the -ends world the audit
# adds (its id read from /props and /tokenize), vLLM's with a min_tokens world (the id declared: --eos-ids)
ENDS = dict(eos=5, sharpness=1.0)
TRAFFIC_PATHS = {
    # --max-samples 1000 (quick's cap otherwise): an audit in about 15 s, so 300 fit an afternoon; the false-alarm
    # rate is alpha's at any sample size
    "traffic-llama": (ENDS, "auto", ((1, 2),), SAMPLINGS, dict(concurrency=4, max_samples=1000)),
    "traffic-vllm": (dict(ENDS, api="vllm"), "openai", ((1, 2),),
                     (Sampling(), Sampling(temperature=0.7, top_k=5),
                      Sampling(temperature=0.8, ignore_eos=False, min_tokens=2)),
                     dict(concurrency=4, eos_ids="5", max_samples=1000)),
}
# structured output (issue 68): constrained worlds (a choice, and a regex at temperature 0.7 / top-k 5) on the exact
# toy under the default mixed traffic, answers ending where the constraint ends (the end of generation, id 5);
# llama.cpp's dialect (GBNF written by the audit, the check-then-resample order) and vLLM's (structured_outputs)
CONSTRAINED = (Sampling.parse("choice=ab|ba|cab|bb"), Sampling.parse("temperature=0.7,top_k=5,regex=[a-c]{2,5}"))
CONSTRAINED_PATHS = {
    "constrained-llama": (ENDS, "auto", ((1, 2),), CONSTRAINED, dict(concurrency=4, length=4, max_samples=600)),
    "constrained-vllm": (dict(ENDS, api="vllm"), "openai", ((1, 2),), CONSTRAINED,
                         dict(concurrency=4, length=4, eos_ids="5", max_samples=600)),
}
# GBNF grammar worlds (read by the audit as the regex of their language, constraints.gbnf_pattern) through
# llama.cpp's dialect: at temperature 1, and at temperature 0.7 / top-k 5 (the check-then-resample order)
GRAMMARS = (Sampling.parse('grammar=root ::= ("a" | "b")+ "c"? [a-b]'),
            Sampling.parse('temperature=0.7,top_k=5,grammar=root ::= [a-c] ("b" | "ca"){0,2}'))
CONSTRAINED_PATHS["grammar-llama"] = (ENDS, "auto", ((1, 2),), GRAMMARS, dict(concurrency=4, length=5, max_samples=600))
TRAFFIC_PATHS.update(CONSTRAINED_PATHS)  # run as the traffic paths are
# JSON-schema worlds (no local engine: the two-sample test against a reference server, speculation off there;
# the toy writes an enum schema bare), llama.cpp's and vLLM's dialects, 600 answers a side
SCHEMAS = (Sampling.parse('json_schema={"enum": ["ab", "ba", "cab", "bb"]}'),
           Sampling.parse('temperature=0.7,top_k=5,json_schema={"enum": ["a", "bc", "cab", "ca", "bbb"]}'))
SCHEMA_PATHS = {
    "schema-llama": (ENDS, "auto", ((1, 2),), SCHEMAS, dict(concurrency=4, length=4, max_samples=600)),
    "schema-vllm": (dict(ENDS, api="vllm"), "openai", ((1, 2),), SCHEMAS,
                    dict(concurrency=4, length=4, eos_ids="5", max_samples=600)),
}
REFERENCE_URL = "local://toy-reference"
BPE_PATHS.update(TRAFFIC_PATHS)  # the same shape: (model fields, api, prompts, samplings, settings)
REPORTS = {"old": "reports/serve-false-alarms.json", "new": "reports/serve-false-alarms-new-worlds.json",
           "penalties": "reports/serve-false-alarms-penalties.json", "stops": "reports/serve-false-alarms-stops.json",
           "bpe": "reports/serve-false-alarms-bpe.json", "traffic": "reports/serve-false-alarms-traffic.json",
           "constrained": "reports/serve-false-alarms-constrained.json", "grammar": "reports/serve-false-alarms-grammar.json",
           "schema": "reports/serve-false-alarms-schema.json"}


def http_like(model: ToyServedModel):
    """A transport answering as HTTP does: a 4xx or 5xx is the ``EndpointError`` the client raises."""
    def transport(base, route, body):
        status, answer = respond(model, route, body)
        if status >= 400:
            detail = answer if isinstance(answer, str) else json.dumps(answer)
            raise EndpointError(f"HTTP {status} from {base.rstrip('/')}{route}: {detail[:200]}",
                                server_fault=status >= 500)
        return answer
    return transport


@functools.lru_cache(maxsize=1)
def tokenizer_dir() -> str:
    from toy_models.hf_served_models import write_llama
    return str(write_llama(seed=0))


@functools.lru_cache(maxsize=1)
def bpe_dir() -> str:
    from toy_models.bpe_models import write_bpe_llama
    return str(write_bpe_llama(seed=0))


def one(seed: int, paths: tuple[str, ...] = tuple(PATHS)) -> dict:
    path = paths[seed % len(paths)]
    extra = {}
    if path in SCHEMA_PATHS:  # a separate reference server (the plain toy): the two-sample test needs one
        fields, api, prompts, samplings, extra = SCHEMA_PATHS[path]
        model = ToyServedModel(**fields)
        audited, reference = http_like(model), http_like(model.as_plain())

        def transport(base, route, body):
            return (reference if base.rstrip("/") == REFERENCE_URL else audited)(base, route, body)
        extra = dict(extra, reference=REFERENCE_URL)
    elif path in TRAFFIC_PATHS:
        fields, api, prompts, samplings, extra = TRAFFIC_PATHS[path]
        model = ToyServedModel(**fields)
        transport = http_like(model)
    elif path in BPE_PATHS:
        fields, api, prompts, samplings, extra = BPE_PATHS[path]
        model = ToyServedModel(vocab=320, **fields, tokenizer_dir=bpe_dir())
        transport = http_like(model)
        # two in flight: concurrent_requests is judged (with one, its verdict is built without evidence and raises)
        extra = dict(extra, concurrency=2, **(dict(model=bpe_dir()) if fields["api"] == "llama-cpp-python" else {}))
    elif path in NEW_PATHS:
        fields, api, prompts, samplings = NEW_PATHS[path]
        model = ToyServedModel(**fields, tokenizer_dir=tokenizer_dir() if fields.get("api") == "mlx-lm" else None)
        transport = http_like(model)
    else:
        fields, api = PATHS[path]
        prompts, samplings = ([1, 2],), SAMPLINGS
        model = ToyServedModel(**fields)

        def transport(base, route, body):
            return respond(model, route, body)[1]

    begun = time.perf_counter()
    result = run_serve_audit("local://toy-served", level="quick", seed=seed, alpha=1e-3, progress=False, api=api,
                             prompts=prompts, samplings=samplings, transport=transport,
                             **{"concurrency": 1, **extra})
    spec = [v for v in result.verdicts if v.law == "speculation_ran"]
    statistical = [v for v in result.verdicts if v.kind.statistical]
    return {"seed": seed, "path": path, "passed": result.passed, "failed": [v.check for v in result.failed],
            "outcomes": {v.check: v.outcome.value for v in result.verdicts},
            "continuation_pvalues": {v.check: v.pvalue for v in statistical if v.law == "continuation"},
            "independent_samples_pvalues": {v.check: v.pvalue for v in statistical if v.law == "independent_samples"},
            "streamed_pvalues": {v.check: v.pvalue for v in statistical if v.law == "streamed"},
            "concurrent_requests_pvalues": {v.check: v.pvalue for v in statistical if v.law == "concurrent_requests"},
            "requests": result.samples_drawn,
            "min_pvalue": min((v.pvalue for v in result.verdicts if v.kind.statistical and v.pvalue is not None),
                              default=None),
            # the text-prompt dialects: prefixes pooled (no text reads back as them) in each continuation law
            "pooled": {v.check: v.summary.rsplit("; ", 1)[-1].split(" pooled")[0] for v in result.verdicts
                       if v.law == "continuation" and " pooled, each one cell" in (v.summary or "")},
            "not_judged": [v.check for v in result.verdicts if v.law == "continuation"
                           and (v.summary or "").startswith("not judged")],
            "speculation_ran": [(v.outcome.value, v.pvalue) for v in spec],
            "seconds": round(time.perf_counter() - begun, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--paths", default="old", help="old (the first three paths), new (mlx-lm, chat-llama, "
                                                       "chat-vllm), penalties (penalty-llama, penalty-vllm), stops "
                                                       "(stops-llama, stops-vllm), bpe (mlx-lm-bpe, "
                                                       "mlx-lm-bpe-penalties, llama-cpp-python-bpe), "
                                                       "constrained (constrained-llama, constrained-vllm), grammar "
                                                       "(grammar-llama), schema (schema-llama, schema-vllm) or a "
                                                       "comma-separated list of paths")
    parser.add_argument("--out", default=None, help="default: reports/serve-false-alarms.json (old), "
                                                    "reports/serve-false-alarms-new-worlds.json (new)")
    args = parser.parse_args()
    paths = tuple(PATHS) if args.paths == "old" else PENALTY_PATHS if args.paths == "penalties" else \
        STOP_PATHS if args.paths == "stops" else ("constrained-llama", "constrained-vllm") if args.paths == "constrained" \
        else ("grammar-llama",) if args.paths == "grammar" else tuple(SCHEMA_PATHS) if args.paths == "schema" else \
        tuple(p for p in TRAFFIC_PATHS if p not in CONSTRAINED_PATHS) if args.paths == "traffic" else \
        tuple(p for p in BPE_PATHS if p not in TRAFFIC_PATHS) if args.paths == "bpe" else \
        tuple(p for p in NEW_PATHS if p not in PENALTY_PATHS + STOP_PATHS) if args.paths == "new" else \
        tuple(args.paths.split(","))
    unknown = [p for p in paths if p not in PATHS and p not in NEW_PATHS and p not in BPE_PATHS and p not in SCHEMA_PATHS]
    if unknown:
        parser.error(f"unknown paths {unknown}: expected some of {', '.join([*PATHS, *NEW_PATHS, *BPE_PATHS])}")
    out = args.out or REPORTS.get(args.paths, "reports/serve-false-alarms-" + "-".join(paths) + ".json")
    if any(p in NEW_PATHS for p in paths):
        tokenizer_dir()  # written once, before the workers read it
    if any(p in BPE_PATHS and p not in TRAFFIC_PATHS for p in paths):
        bpe_dir()
    begun = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(functools.partial(one, paths=paths), range(args.seeds)):
            rows.append(row)
            write(rows, paths, args, out, begun)  # after every audit: an interrupted run keeps what it measured
    data = write(rows, paths, args, out, begun)
    print(f"{data['false_alarms']} false alarms in {len(rows)} quick serve audits at alpha 1e-3 ({data['seconds']} s); "
          f"by path: {json.dumps(data['by_path'])}; written {out}")


def deciles(values: list[float]) -> list[int]:
    """How many p-values fall in [0, 0.1), [0.1, 0.2), ... [0.9, 1]: about even under the null (the
    exact discrete tests put their mass on fewer points, piled toward 1)."""
    counts = [0] * 10
    for p in values:
        counts[min(int(p * 10), 9)] += 1
    return counts


def write(rows: list[dict], paths: tuple[str, ...], args, out: str, begun: float) -> dict:
    alarms = [r for r in rows if not r["passed"]]
    by_path = {}
    for name in paths:
        mine = [r for r in rows if r["path"] == name]
        judged = [p for r in mine for outcome, p in r["speculation_ran"] if p is not None]
        by_path[name] = {"audits": len(mine), "false_alarms": sum(not r["passed"] for r in mine),
                         "speculation_ran_false_alarms": sum(any(c.endswith("/speculation_ran") for c in r["failed"])
                                                             for r in mine),
                         "speculation_ran_judged": len(judged),
                         "speculation_ran_not_judged": sum(p is None for r in mine for _, p in r["speculation_ran"]),
                         "smallest_speculation_pvalue": min(judged, default=None),
                         "smallest_pvalue": min((r["min_pvalue"] for r in mine if r["min_pvalue"] is not None),
                                                default=None),
                         "continuation_judged": sum(p is not None for r in mine
                                                    for p in r.get("continuation_pvalues", {}).values()),
                         "smallest_continuation_pvalue": min((p for r in mine
                                                              for p in r.get("continuation_pvalues", {}).values()
                                                              if p is not None), default=None),
                         "independent_samples_judged": sum(p is not None for r in mine
                                                           for p in r.get("independent_samples_pvalues", {}).values()),
                         "independent_samples_false_alarms": sum(
                             any(c.endswith("/independent_samples") for c in r["failed"]) for r in mine),
                         "smallest_independent_samples_pvalue": min(
                             (p for r in mine for p in r.get("independent_samples_pvalues", {}).values()
                              if p is not None), default=None),
                         "seconds": round(sum(r["seconds"] for r in mine), 1)}
        for law in ("streamed", "concurrent_requests"):  # the new statistical checks (issue 67): their p-values
            values = [p for r in mine for p in r.get(f"{law}_pvalues", {}).values() if p is not None]
            by_path[name].update({f"{law}_judged": len(values), f"{law}_false_alarms": sum(
                any(c.endswith(f"/{law}") for c in r["failed"]) for r in mine),
                f"smallest_{law}_pvalue": min(values, default=None), f"{law}_pvalue_deciles": deciles(values)})
        by_path[name]["finish_findings"] = sum(any(c.endswith("/finish") for c in r["failed"]) for r in mine)
    data = {"what": "quick serve audits of exact toy served models (2 worlds: 1 prompt x 2 samplings; continuation "
                    "laws of 3 tokens, independent_samples (2 samples a request: the pooled law and the same-cell "
                    "pair count) and speculation_ran tests under Holm at alpha 1e-3, plus the deterministic "
                    f"checks), {len(paths)} paths by seed: " + ", ".join(paths),
            "alpha": 1e-3, "audits": len(rows), "false_alarms": len(alarms), "by_path": by_path,
            "alarms": alarms, "planned": args.seeds, "complete": len(rows) == args.seeds, "jobs": args.jobs,
            "seconds": round(time.perf_counter() - begun, 1), "rows": rows}
    Path(out + ".tmp").write_text(json.dumps(data, indent=1) + "\n")
    Path(out + ".tmp").replace(out)  # never half a report
    return data


if __name__ == "__main__":
    main()
