"""The chat endpoint as a serve-audit world (exactcheck.serve.chat): a conversation's answers from
``/v1/chat/completions`` against the law of the tokens its chat template made, computed from the
reference's completions endpoint. On the toy served model (llama.cpp's and vLLM's chat dialects),
then (long) on a real llama-server with a chat template of the tiny GGUF's vocabulary: the exact
server passes, a proxy that samples the chat answers hotter is found; answers without token ids, a
tokenizer whose template is not the server's, and a server without a chat template are "not
judged" or one line (exit 2), never a guess or a traceback."""
from __future__ import annotations

import time

import pytest

from exactcheck.serve.chat import ChatPrompt
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.serve.mutants import PROXY_MUTANTS, proxy
from exactcheck.serve.runner import run_serve_audit
from toy_models.served_lm import ToyServedModel, chat_template_ids, served_model

CHAT = ChatPrompt.parse(["system:be brief", "user:abc"])
SMALL = dict(level="quick", seed=0, progress=False, samplings=(Sampling(),), max_samples=1200, traffic="sequential")
CHECKS = ("continuation", "logprob_fidelity", "same_seed", "speculation_ran")


@pytest.fixture(scope="module")
def llama_toy():
    model = ToyServedModel()
    with served_model(model) as target, served_model(model.as_plain()) as plain:
        yield target, plain


def _by_check(result) -> dict:
    return {v.check: v for v in result.verdicts}


@pytest.mark.long  # (8-16 s on 2 shared cores: the long run)
def test_an_exact_server_passes_through_its_chat_endpoint(llama_toy):
    """llama.cpp's dialect: the template's tokens from /apply-template and /tokenize, the answers'
    ids from logprobs.content; the law from the reference's /completion after those tokens."""
    target, plain = llama_toy
    before = dict(target.requests)
    result = run_serve_audit(target.url, reference=plain.url, prompts=(CHAT,), **SMALL)
    assert result.passed, [v.describe() for v in result.failed]
    verdicts = _by_check(result)
    assert verdicts["c0-t1/continuation"].outcome.value == "exact"
    assert verdicts["c0-t1/speculation_ran"].outcome.value == "exact"  # timings come with the chat answers
    assert verdicts["greedy/greedy_identity"].outcome.value == "exact"
    ids = chat_template_ids(target.model, CHAT.as_json())
    condition = verdicts["c0-t1/continuation"].condition
    assert f"the {len(ids)} tokens of the server's template (POST /apply-template" in condition
    sent = {path: n - before.get(path, 0) for path, n in target.requests.items()}
    assert sent["/v1/chat/completions"] >= 1200 and sent.get("/completion", 0) == 0  # audited: chat only
    assert plain.requests["/completion"] > 0  # the law: the reference's completions endpoint
    assert "--message 'system:be brief' --message user:abc" in verdicts["c0-t1/continuation"].reproduce


@pytest.mark.long  # (8-16 s on 2 shared cores: the long run)
def test_an_exact_vllm_shaped_server_passes_and_its_prompt_ids_are_checked():
    """vLLM's dialect: /tokenize with messages, return_token_ids (prompt_token_ids, token_ids),
    raw logprobs as "token_id:N", server-wide /metrics counters."""
    model = ToyServedModel(api="vllm")
    with served_model(model) as target, served_model(model.as_plain()) as plain:
        result = run_serve_audit(target.url, reference=plain.url, api="openai", prompts=(CHAT,),
                                 **dict(SMALL, max_samples=600))
    assert result.passed, [v.describe() for v in result.failed]
    verdicts = _by_check(result)
    assert verdicts["c0-t1/continuation"].outcome.value == "exact"
    assert verdicts["c0-t1/logprob_fidelity"].outcome.value == "exact"  # raw, against the reference's raw
    assert "POST /tokenize with messages" in verdicts["c0-t1/continuation"].condition


@pytest.mark.long  # (8-16 s on 2 shared cores: the long run)
def test_a_chat_path_that_samples_hotter_is_found_and_the_completions_path_passes(llama_toy):
    target, plain = llama_toy
    with proxy("chat_hotter", target.url) as p:
        result = run_serve_audit(p.url, reference=plain.url, prompts=(CHAT, (1, 2)), **SMALL)
    verdicts = _by_check(result)
    assert not result.passed
    assert verdicts["c0-t1/continuation"].outcome.value == "defect"
    assert PROXY_MUTANTS["chat_hotter"].caught_by == "continuation"
    assert "hotter" in verdicts["c0-t1/continuation"].summary
    assert verdicts["p0-t1/continuation"].outcome.value == "exact"


@pytest.mark.parametrize("api", ["llama.cpp", "vllm"])
def test_chat_answers_with_text_only_are_not_judged_with_the_reason(api):
    model = ToyServedModel(api=api, chat="text")
    with served_model(model) as target:
        result = run_serve_audit(target.url, api="openai" if api == "vllm" else "auto", prompts=(CHAT, (1, 2)),
                                 **dict(SMALL, max_samples=300))
    verdicts = _by_check(result)
    for check in CHECKS:
        v = verdicts[f"c0-t1/{check}"]
        assert v.outcome.value == "inconclusive" and "only message.content text" in v.summary, v.summary
        assert "re-tokenising text is not unambiguous" in v.summary
    assert verdicts["p0-t1/continuation"].outcome.value == "exact"  # the completions worlds are audited
    assert target.requests["/v1/chat/completions"] == 1  # one probe, then nothing sent for that world


def _tokenizer_dir(path, vocab: int, generation_prompt: bool = True) -> str:
    """A tokenizer directory whose chat template is the toy server's (or, without the generation
    prompt, one token short of it), for --chat-template-tokenizer."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    base = vocab * (0x2000 // vocab + 1)
    marks = {role: chr(base + vocab - k) for role, k in (("system", 3), ("user", 2), ("assistant", 1))}
    table = {c: ord(c) % vocab for c in "abc"} | {m: ord(m) % vocab for m in marks.values()} | {"[UNK]": 0}
    tok = Tokenizer(models.WordLevel(table, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    template = ("{% for m in messages %}{% if m['role'] == 'system' %}" + marks["system"] + "{% elif m['role'] == "
                "'user' %}" + marks["user"] + "{% else %}" + marks["assistant"] + "{% endif %}{{ m['content'] }}"
                "{% endfor %}" + ("{% if add_generation_prompt %}" + marks["assistant"] + "{% endif %}"
                                  if generation_prompt else ""))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", chat_template=template).save_pretrained(path)
    return str(path)


def test_a_named_tokenizer_makes_the_prompt_and_one_that_is_not_the_servers_is_not_judged(llama_toy, tmp_path):
    target, plain = llama_toy
    conversation = ChatPrompt.parse(["user:abc"])
    good = _tokenizer_dir(tmp_path / "good", target.model.vocab)
    result = run_serve_audit(target.url, reference=plain.url, prompts=(conversation,), chat_template_tokenizer=good,
                             **dict(SMALL, max_samples=600))
    verdicts = _by_check(result)
    assert verdicts["c0-t1/continuation"].outcome.value == "exact", verdicts["c0-t1/continuation"].describe()
    assert f"the chat template of {good}" in verdicts["c0-t1/continuation"].condition
    assert f"--chat-template-tokenizer {good}" in verdicts["c0-t1/continuation"].reproduce
    short = _tokenizer_dir(tmp_path / "short", target.model.vocab, generation_prompt=False)
    result = run_serve_audit(target.url, reference=plain.url, prompts=(conversation,), chat_template_tokenizer=short,
                             **dict(SMALL, max_samples=600))
    summary = _by_check(result)["c0-t1/continuation"].summary
    assert "not judged: the server's chat prompt has 5 tokens (usage.prompt_tokens)" in summary
    assert "makes 4" in summary


@pytest.mark.parametrize("api", ["llama.cpp", "vllm"])
def test_a_server_without_a_chat_template_is_one_line_and_exit_2(api, capsys):
    from exactcheck.cli import main
    with served_model(ToyServedModel(api=api, chat="none")) as target:
        code = main(["serve", target.url, "--message", "user:abc", "--max-samples", "100", "--quiet"]
                    + (["--api", "openai"] if api == "vllm" else []))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "cannot render [user: 'abc'] with a chat template (HTTP 400" in err[0]
    assert "--chat-template-tokenizer DIR" in err[0]


def test_the_command_line_builds_chat_worlds_and_refuses_bad_messages(capsys):
    import argparse

    from exactcheck.options import AuditOptions
    from exactcheck.serve import entry
    from exactcheck.serve.settings import DEFAULT_CHAT
    parser = argparse.ArgumentParser()
    entry.serve_arguments(parser)
    own = entry.serve_settings(parser.parse_args(["http://h:1", "--message", "system:be: brief", "--message",
                                                  "user:abc", "--prompt-ids", "1,2"]))
    assert own["prompts"] == ((1, 2), ChatPrompt((("system", "be: brief"), ("user", "abc"))))
    names = [c.name for c in entry.plan("http://h:1", AuditOptions(), **own).checks]
    assert "c0-t1/continuation" in names and "p0-t1/continuation" in names
    assert entry.serve_settings(parser.parse_args(["http://h:1", "--chat"]))["prompts"] == (DEFAULT_CHAT,)
    from exactcheck.cli import main
    assert main(["serve", "http://127.0.0.1:9", "--message", "nobody"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "exactcheck: error: --message 'nobody': expected ROLE:TEXT, e.g. user:Once upon a time"]
    assert main(["serve", "http://127.0.0.1:9", "--chat-template-tokenizer", "d"]) == 2
    assert "give --chat or --message" in capsys.readouterr().err


# --- a real llama-server (release 11434, built by .ci/llama-server) ---------------------------------

# the tiny GGUF served with a chat template in its vocabulary that adds role names, newlines and the
# generation prompt (toy_models.gguf_models.ROLE_CHAT_TEMPLATE), so the template's own tokens are audited
GGUF_CHAT = ChatPrompt.parse(["system:be brief", "user:Once upon a time"])


@pytest.mark.long
def test_a_real_llama_server_passes_its_chat_audit_and_a_hotter_chat_proxy_is_found(tmp_path):
    """The target alone, its own reference (one-token /completion requests after the template's
    tokens), then the chat_hotter proxy in front of it. Under 90 s on 2 shared cores."""
    pytest.importorskip("gguf")
    from serve_fixtures import llama_server, llama_server_binary

    from toy_models.gguf_models import ROLE_CHAT_TEMPLATE, write_pair
    llama_server_binary()
    target_gguf, _ = write_pair(seed=0)
    template = tmp_path / "chat.jinja"
    template.write_text(ROLE_CHAT_TEMPLATE)
    begun = time.monotonic()
    audit = dict(level="quick", seed=0, progress=False, prompts=(GGUF_CHAT,), n_probs=64, max_samples=2000,
                 samplings=(Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=8, top_p=0.95, min_p=0.05)),
                 traffic="sequential")  # the two worlds alone: the mixed traffic's twins are test_serve_llama.py's
    with llama_server(target_gguf, extra_args=("--jinja", "--chat-template-file", str(template))) as target:
        exact = run_serve_audit(target, **audit)
        with proxy("chat_hotter", target) as p:
            hotter = run_serve_audit(p.url, reference=target, **dict(audit, samplings=audit["samplings"][:1]))
    assert exact.passed, [v.describe() for v in exact.failed]
    laws = [v for v in exact.verdicts if v.law == "continuation"]
    assert len(laws) == 2 and all(v.outcome.value == "exact" for v in laws)
    assert all("tokens of the server's template (POST /apply-template" in v.condition for v in laws)
    found = _by_check(hotter)["c0-t1/continuation"]
    assert found.outcome.value == "defect" and "hotter" in found.summary
    assert time.monotonic() - begun < 90
