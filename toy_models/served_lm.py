"""A served toy language model with exact laws: a llama.cpp-shaped HTTP server on 127.0.0.1.

The serve audit's own world: what a served model looks like from outside (``/health``, ``/props``,
``/tokenize``, ``POST /completion`` with token-id prompts, ``n_probs`` and
``post_sampling_probs``, ``timings.draft_n``), over a context toy LM whose next-token law is a
table we own, so every law the audit derives from it is known exactly. It samples with
llama.cpp's sampler order (top-k, top-p, min-p, then temperature) and, when ``speculative``,
drafts ``draft_max`` tokens from a draft table and verifies them by rejection sampling with the
exact residual (lossless), reporting its drafts as llama.cpp does. Randomness comes from the
request's seed only. Every request is counted per path (``requests``), so a test can count what
reached the server.

It speaks three APIs (``api``): ``"llama.cpp"`` (the native ``/completion`` and llama.cpp's
``/v1/completions``: ids only inside ``logprobs.content``, ``post_sampling_probs`` honoured,
``timings`` per request), and ``"vllm"`` (``/v1/models``, ``/v1/completions`` only: ``token_ids`` with
``return_token_ids``, raw logprobs in the legacy format keyed ``"token_id:N"`` with
``return_tokens_as_token_ids``, speculation counters server-wide in ``/metrics``, no ``/props``),
as vLLM documents them; ``server_info`` adds SGLang's ``/get_server_info``.

Both serve ``/v1/chat/completions`` over a toy chat template (``chat_template_ids``: a role token
per message, the content's characters, then the assistant's role token), as each engine answers it:
llama.cpp renders through ``POST /apply-template`` and ``/tokenize``, carries ids only in
``logprobs.content`` (``top_logprobs`` is its ``n_probs``) and the prompt's size in ``usage``; vLLM
tokenizes ``messages`` on ``/tokenize`` and returns ``prompt_token_ids`` and ``token_ids`` with
``return_token_ids``. ``chat``: ``"ids"`` (as above), ``"text"`` (answers with text only), ``"none"``
(no chat template: every chat request and rendering answers 400).

``api="mlx-lm"`` and ``api="llama-cpp-python"`` speak those servers' text-prompt dialects
(``toy_models.served_text``): text prompts read into ids by the tokenizer of ``tokenizer_dir``.

Requests for several samples (llama.cpp's ``n_cmpl`` on ``/completion``, a list of results back;
OpenAI's ``n``, indexed ``choices``) draw sample j with the request's seed + j, as llama.cpp and vLLM
seed their children (``several_mutant="same_seed"``: all alike). Stop strings (``stop``) end an
answer at the first token whose text (``token_text``: its letter) completes one, every token up to
it returned and the text cut before the stop, as llama.cpp and vLLM answer (``stop_mutant="step_end"``:
at the end of that token's speculation step); ``/detokenize`` answers in each engine's shape, and a
``logit_bias`` of 100 or more forces its token (what the audit reads a llama.cpp piece with).

For tests and measurements only: it listens on 127.0.0.1, serves until stopped, and each request
is bounded by its ``n_predict``.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from exactcheck.contracts.loopback import LoopbackServer
from toy_models.served_constraints import CONSTRAINT_MUTANTS, constrained_chain, from_body

__all__ = ["ToyServedModel", "served_model", "sampler_chain", "respond", "chat_template_ids", "token_text"]


def sampler_chain(probs: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0) -> np.ndarray:
    """llama.cpp's order: top-k, top-p, min-p on the raw probabilities, then temperature on what
    is left (float64); temperature 0 is the argmax (lowest id on a tie)."""
    p = np.asarray(probs, dtype=np.float64)
    keep = p > 0
    order = np.lexsort((np.arange(p.size), -p))  # descending probability, then id
    if top_k and top_k < p.size:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        sorted_p = np.where(keep[order], p[order], 0.0)
        cumulative = np.cumsum(sorted_p) / sorted_p.sum()
        cut = int(np.searchsorted(cumulative, top_p)) + 1  # the token that crosses top_p is kept
        keep[order[cut:]] = False
    if min_p > 0:
        keep &= p >= min_p * p[keep].max()
    if temperature <= 0:
        out = np.zeros_like(p)
        out[order[np.argmax(keep[order])]] = 1.0
        return out
    logits = np.where(keep, np.log(np.where(keep, p, 1.0)) / temperature, -np.inf)
    logits -= logits[keep].max()
    out = np.where(keep, np.exp(logits), 0.0)
    return out / out.sum()


@dataclass
class ToyServedModel:
    """Next-token laws that depend on the last token (a bigram table, ``vocab`` x ``vocab``, row
    ``vocab`` for the empty context), peaked by ``sharpness``; a draft table near it."""

    vocab: int = 12
    seed: int = 0
    sharpness: float = 2.0
    draft_noise: float = 0.6
    speculative: bool = True
    draft_max: int = 3
    api: str = "llama.cpp"  # or "vllm"
    server_info: dict | None = None  # SGLang's /get_server_info, when set
    # "model": drafts from the draft table at every step; "ngram": prompt lookup, drafting only
    # where the last ``ngram`` tokens occurred earlier in the context (the tokens that followed
    # them, as a deterministic proposal: rarely on contexts that do not repeat)
    drafter: str = "model"
    ngram: int = 2
    chat: str = "ids"  # "ids", "text" (chat answers without token ids) or "none" (no chat template)
    # a penalty defect: "stale" verifies every draft of a step with the penalty history as it was
    # when the step began (SGLang PR #33643: penalties fed once per step), accepted drafts unread;
    # "ignored" verifies drafts with no penalty at all (TRT-LLM PR #17701: one-model speculation)
    penalty_mutant: str | None = None
    # several samples of one request (llama.cpp's n_cmpl on /completion, OpenAI's n): sample j is
    # drawn with the request's seed + j, as llama.cpp (server-task.h add_child) and vLLM
    # (parallel_sampling.py) seed their children; "same_seed" draws every one with the request's
    # seed, so they repeat each other (the point llama.cpp PR #18700's review raised)
    several_mutant: str | None = None
    # stop strings: "step_end" checks them once per speculation step, returning the tokens the step
    # accepted past the one that completed the stop
    stop_mutant: str | None = None
    tokenizer_dir: str | None = None  # api "mlx-lm": the model directory whose tokenizer reads the text prompts
    # a defect of batch composition (``BATCH_MUTANTS``): the single-sample completion requests in flight
    # together are then served as one batch (those arriving within ``batch_window`` seconds of the first,
    # at most ``max_batch``), as an engine's scheduler batches them; None: each request on its own
    batch_mutant: str | None = None
    # an end-of-generation token: a request without ignore_eos ends where it is sampled (its id in the
    # answer's tokens, llama.cpp's stop_type "eos", OpenAI's finish_reason "stop"); with ignore_eos,
    # llama.cpp masks it (a -inf bias), vLLM does not stop at it; min_tokens (vLLM) masks it for the
    # first tokens. None: no such token (every answer has the asked length)
    eos: int | None = None
    # a defect at the end of an answer: "past_eos" keeps the tokens a speculation step accepted after
    # an end-of-generation token; "length_hides_stop" reports an answer ended by one as cut by the
    # length cap; "usage_drafted" counts the rejected drafts among the completion tokens
    finish_mutant: str | None = None
    # a defect of structured output under speculation (``toy_models.served_constraints.CONSTRAINT_MUTANTS``);
    # a request's constraint (llama.cpp's ``grammar``, vLLM's ``structured_outputs``) is honoured exactly
    # otherwise: its mask on every verified position and on the bonus token, the matcher rolled back
    constraint_mutant: str | None = None
    batch_window: float = 0.004
    max_batch: int = 8
    target: np.ndarray = field(init=False, repr=False)
    draft: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        logits = rng.normal(size=(self.vocab + 1, self.vocab)) * self.sharpness
        self.target = _softmax(logits)
        self.draft = _softmax(logits + rng.normal(size=logits.shape) * self.draft_noise)
        self.totals = [0, 0]  # drafted, accepted: vLLM's /metrics counters
        self.lock = threading.Lock()
        self.batches = Counter()  # rows per batch served (batch_mutant only): how often rows shared one
        self._batcher = None
        if self.batch_mutant is not None and self.batch_mutant not in BATCH_MUTANTS:
            raise ValueError(f"batch_mutant {self.batch_mutant!r}: one of {', '.join(BATCH_MUTANTS)}")
        if self.constraint_mutant is not None and self.constraint_mutant not in CONSTRAINT_MUTANTS:
            raise ValueError(f"constraint_mutant {self.constraint_mutant!r}: one of {', '.join(CONSTRAINT_MUTANTS)}")

    def as_draft(self) -> "ToyServedModel":
        """The draft model served on its own: its table as the target, no speculation."""
        other = self.as_plain()
        other.target = self.draft
        return other

    def as_plain(self) -> "ToyServedModel":
        """The same target without speculation."""
        return ToyServedModel(self.vocab, self.seed, self.sharpness, self.draft_noise, speculative=False, api=self.api,
                              drafter=self.drafter, ngram=self.ngram, chat=self.chat,
                              tokenizer_dir=self.tokenizer_dir, eos=self.eos)

    def row(self, table: np.ndarray, context: list[int]) -> np.ndarray:
        return table[context[-1] if context else self.vocab]

    def law(self, context: list[int], sampling: dict, history: list[int] | None = None,
            position: int | None = None, text: str | None = None) -> np.ndarray:
        """The target's law after ``context`` under ``sampling``: its penalties (``Penalties``) read
        ``history`` (default: the context itself), the end-of-generation token masked where the
        request's settings mask it at the answer's ``position`` (``masks_eos``), then the sampler chain;
        with the request's constraint, its mask after the answer's ``text`` (None: unmasked), met in
        the dialect's order (``served_constraints.constrained_chain``)."""
        row = self.row(self.target, context)
        penalties = sampling.get("penalties")
        if penalties is not None:
            row = penalties.apply(row, context if history is None else history)
        row = self.masked(row, sampling, position)
        constraint = sampling.get("constraint")
        if constraint is None or text is None:
            return sampler_chain(row, **_chain(sampling))
        allowed = constraint.allowed(text, self.texts, self.eos)
        order = "check-then-resample" if self.api == "llama.cpp" else "mask-first"
        return constrained_chain(row, allowed, lambda r: sampler_chain(r, **_chain(sampling)), order)

    def _target_law(self, context: list[int], sampling: dict, history: list[int] | None = None,
                    position: int | None = None, text: str | None = None) -> np.ndarray:
        """``law``, the matcher's ``text`` passed only where the request has a constraint (a subclass's
        own ``law`` without constraints keeps working)."""
        if sampling.get("constraint") is None:
            return self.law(context, sampling, history, position)
        return self.law(context, sampling, history, position, text=text)

    @property
    def texts(self) -> list[str]:
        """Each token's text as a constraint reads it (the end-of-generation token's: none)."""
        return ["" if t == self.eos else token_text(t) for t in range(self.vocab)]

    def text_of(self, tokens: list[int]) -> str:
        return "".join(token_text(t) for t in tokens if t != self.eos)

    def masks_eos(self, sampling: dict, position: int | None) -> bool:
        """Whether the end-of-generation token is masked here: llama.cpp's ignore_eos (a -inf bias), or
        vLLM's min_tokens while the answer is shorter than it."""
        if self.eos is None:
            return False
        ignored = sampling.get("ignore_eos", True) and self.api != "vllm"
        return bool(ignored or (position is not None and position < sampling.get("min_tokens", 0)))

    def masked(self, row: np.ndarray, sampling: dict, position: int | None) -> np.ndarray:
        if not self.masks_eos(sampling, position):
            return row
        row = row.copy()
        row[self.eos] = 0.0
        return row / row.sum()

    def ended(self, tokens: list[int], sampling: dict) -> bool:
        """Whether the answer is said to have ended on the end-of-generation token (its last)
        (``finish_mutant="length_hides_stop"``: never, the length cap named instead)."""
        return bool(self.ends(sampling) and tokens and tokens[-1] == self.eos
                    and self.finish_mutant != "length_hides_stop")

    def counted(self, tokens: list[int], drafted: int, accepted: int) -> int:
        """The completion tokens the answer's usage counts (``finish_mutant="usage_drafted"``: the
        rejected drafts too)."""
        return len(tokens) + (drafted - accepted if self.finish_mutant == "usage_drafted" else 0)

    def ends(self, sampling: dict) -> bool:
        """Whether an answer ends where the end-of-generation token is sampled (no ignore_eos)."""
        return self.eos is not None and not sampling.get("ignore_eos", True)

    def _propose(self, context: list[int], k: int, sampling: dict, rng,
                 position: int | None = None, text: str = "") -> tuple[list[int], list[np.ndarray]]:
        """Up to ``k`` draft tokens and the law each was drawn from (one-hot for prompt lookup); with a
        constraint, each drawn under its mask after the matcher's ``text`` and the drafts before it."""
        if self.drafter == "ngram":
            n = self.ngram
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # the latest earlier occurrence
                if context[start:start + n] == tail:
                    proposal = context[start + n:start + n + k]
                    return proposal, [np.eye(self.vocab)[x] for x in proposal]
            return [], []
        proposal, q_rows, draft_context = [], [], list(context)
        for i in range(k):
            row = self.masked(self.row(self.draft, draft_context), sampling, None if position is None else position + i)
            constraint = sampling.get("constraint")
            draft_text = text + self.text_of(proposal)
            if constraint is not None and not (self.constraint_mutant == "past_accept"
                                               and constraint.ended(draft_text, self.texts, self.eos)):
                row = constrained_chain(row, constraint.allowed(draft_text, self.texts, self.eos), lambda r: r,
                                        "mask-first")
            q = sampler_chain(row, **_chain(sampling))  # drafts: no penalty
            x = _sample(q, rng)
            proposal.append(x)
            q_rows.append(q)
            draft_context.append(x)
        return proposal, q_rows

    def complete(self, prompt: list[int], n_predict: int, sampling: dict, seed: int,
                 steps: list[int] | None = None, handed: list[int] | None = None,
                 record: list[int] | None = None) -> tuple[list[int], int, int]:
        """(tokens, drafts proposed, drafts accepted): the first token from the target, the rest by
        speculation when ``speculative`` (exact), else from the target one by one. ``steps``: the
        number of tokens out after each step is appended to it; ``record``: the drafts each
        speculation step accepted; ``handed``: a defect, each step accepts as many drafts as that
        list says (another row's counts: ``batch_mutant="other_row_accepted"``) instead of deciding."""
        rng = np.random.default_rng(seed)
        context, out, drafted, accepted = list(prompt), [], 0, 0
        spec_steps = 0  # speculation steps done
        ends = self.ends(sampling)
        text = ""  # the constraint's matcher's text (exact: the answer's)
        while len(out) < n_predict and not (ends and self.eos in out):
            if steps is not None and out:
                steps.append(len(out))
            if not self.speculative or not out or sampling["temperature"] <= 0:
                token = _sample(self._target_law(context, sampling, position=len(out), text=text), rng)
                out.append(token)
                context.append(token)
                text += self.text_of([token])
                continue
            k = min(self.draft_max, n_predict - len(out))
            proposal, q_rows = self._propose(context, k, sampling, rng, len(out), text)
            if not proposal:  # nothing to draft here (n-gram: the context does not repeat)
                token = _sample(self._target_law(context, sampling, position=len(out), text=text), rng)
                out.append(token)
                context.append(token)
                text += self.text_of([token])
                continue
            drafted += len(proposal)
            step_start, step_text = list(context), text
            verify = {**_chain(sampling), **_ending(sampling), **_constraint_of(sampling)} \
                if self.penalty_mutant == "ignored" else sampling
            given = handed[spec_steps] if handed is not None and spec_steps < len(handed) else None
            spec_steps += 1
            before = accepted
            for i, (x, q) in enumerate(zip(proposal, q_rows)):
                p = self._target_law(context, verify, step_start if self.penalty_mutant == "stale" else None, len(out),
                                     text=self._verify_text(sampling, text, step_text))
                if (rng.random() < min(1.0, p[x] / q[x])) if given is None else i < given:
                    accepted += 1
                    out.append(x)
                    context.append(x)
                    text += self.text_of([x])
                    if ends and x == self.eos and self.finish_mutant != "past_eos":
                        break  # the answer ends at an accepted end-of-generation token
                    continue
                if self.constraint_mutant == "no_rollback":  # the rejected drafts stay in the matcher
                    text += self.text_of(proposal[i:])
                residual = np.maximum(p - q, 0.0)
                residual = residual if residual.sum() > 0 else p
                token = _sample(residual / residual.sum(), rng)
                out.append(token)
                context.append(token)
                text += self.text_of([token])
                break
            else:  # every draft accepted: the bonus token
                if len(out) < n_predict and not (ends and self.eos in out[len(out) - len(proposal):]):
                    bonus_text = None if self.constraint_mutant == "bonus_unmasked" else text
                    token = _sample(self._target_law(context, sampling, position=len(out), text=bonus_text), rng)
                    out.append(token)
                    context.append(token)
                    text += self.text_of([token])
            if record is not None:
                record.append(accepted - before)
        with self.lock:
            self.totals[0] += drafted
            self.totals[1] += accepted
        if steps is not None:
            steps.append(min(len(out), n_predict))
        return out[:n_predict], drafted, accepted

    def _verify_text(self, sampling: dict, text: str, step_text: str) -> str | None:
        """The text the matcher masks a draft position with (``constraint_mutant``: the step's first
        position's, or none where the constraint has ended); exact: the answer's so far."""
        constraint = sampling.get("constraint")
        if constraint is None or self.constraint_mutant is None:
            return text
        if self.constraint_mutant == "first_mask":
            return step_text
        if self.constraint_mutant == "past_accept" and constraint.ended(text, self.texts, self.eos):
            return None
        return text

    def generate(self, prompt: list[int], n_predict: int, sampling: dict, seed: int,
                 stops: list[str] | None = None, handed: list[int] | None = None,
                 record: list[int] | None = None, steps_out: list[int] | None = None
                 ) -> tuple[list[int], int, int, str | None]:
        """``complete``, then the answer ended at the first token whose text (``token_text`` of the
        continuation, the prompt not searched) completes a stop string: (tokens, drafted, accepted,
        the stop string found or None). ``stop_mutant="step_end"`` ends it at the end of that
        token's speculation step instead (the tokens a verify step accepted past the stop returned).
        ``steps_out``: the number of tokens out after each step is appended to it (a stream's events)."""
        steps: list[int] = steps_out if steps_out is not None else []
        tokens, drafted, accepted = self.complete(prompt, n_predict, sampling, seed, steps, handed, record)
        text = ""
        for j, token in enumerate(tokens, start=1):
            text += token_text(token)
            found = next((s for s in stops or () if s in text), None)
            if found is not None:
                end = next((e for e in steps if e >= j), j) if self.stop_mutant == "step_end" else j
                return tokens[:end], drafted, accepted, found
        return tokens, drafted, accepted, None


    def generate_request(self, prompt: list[int], n_predict: int, sampling: dict, body: dict,
                         steps: list[int] | None = None):
        """``generate`` for one single-sample completion request: on its own, or (``batch_mutant``)
        as a row of the batch it is in flight with; ``steps``: where each speculation step ended."""
        row = _Row(list(prompt), n_predict, sampling, _seed_of(body), body.get("stop"), not _seeded(body), steps)
        if self.batch_mutant is None:
            return self.generate(row.prompt, row.n_predict, row.sampling, row.seed, row.stops, steps_out=steps)
        with self.lock:
            if self._batcher is None:
                self._batcher = _Batcher(self)
        return self._batcher.submit(row)

    def generate_rows(self, rows: "list[_Row]") -> list:
        """One batch's rows, each generated as ``generate`` does, but for the batch mutant's defect
        across rows (``BATCH_MUTANTS``)."""
        with self.lock:
            self.batches[len(rows)] += 1
        mutant, first = self.batch_mutant, rows[0]
        if mutant == "other_row_settings":  # every row sampled with the first row's sampler settings
            rows = [replace(r, sampling=_with_penalties({**_chain(first.sampling), **_ending(r.sampling)},
                                                        r.sampling.get("penalties"))) for r in rows]
        elif mutant == "batch_penalties":  # a row without penalties given a batch mate's
            donor = next((r.sampling["penalties"] for r in rows if r.sampling.get("penalties") is not None), None)
            if donor is not None:
                rows = [r if r.sampling.get("penalties") is not None else
                        replace(r, sampling=_with_penalties(r.sampling, donor)) for r in rows]
        elif mutant == "shared_stream":  # the unseeded rows of a batch draw one stream: the first one's
            unseeded = [r for r in rows if r.unseeded]
            rows = [replace(r, seed=unseeded[0].seed) if r.unseeded else r for r in rows]
        out, counts = [], None
        for j, r in enumerate(rows):
            if mutant == "wide_batch_greedy" and j >= 4 and r.sampling["temperature"] <= 0 and r.n_predict:
                second = int(np.argsort(self.law(r.prompt, _chain(r.sampling) | {"temperature": 1.0}))[-2])
                rest = self.generate(r.prompt + [second], r.n_predict - 1, r.sampling, r.seed, r.stops)
                out.append(([second] + rest[0], *rest[1:]))
                continue
            handed = None
            if mutant == "other_row_accepted" and j > 0 and len(r.prompt) != len(first.prompt):
                handed = counts  # a row of another length handed the first row's accepted counts
            record: list[int] = []
            out.append(self.generate(r.prompt, r.n_predict, r.sampling, r.seed, r.stops, handed, record, r.steps))
            if j == 0:
                counts = record
        return out


# the defects of batch composition the toy can have (``ToyServedModel.batch_mutant``): each changes
# what a row receives only where the rows of a batch differ, so a batch of identical requests hides it
BATCH_MUTANTS = {
    "other_row_settings": "every row of a batch sampled with the first row's sampling settings (TensorRT-LLM #12588)",
    "shared_stream": "the unseeded rows of a batch share one random stream: each is handed the first unseeded "
                     "row's random numbers (TensorRT-LLM #19487)",
    "other_row_accepted": "a row of another prompt length handed the first row's accepted draft counts "
                          "(vLLM #45100, #53919: an async race hands a request another row's accepted count)",
    "batch_penalties": "a row without penalties sampled with the penalties of a batch mate that has some",
    "wide_batch_greedy": "a greedy row past the fourth of a batch takes the second most likely token first (a "
                         "batch-size-dependent kernel path that breaks ties wrongly)",
}


@dataclass(frozen=True)
class _Row:
    prompt: list
    n_predict: int
    sampling: dict
    seed: int
    stops: list | None
    unseeded: bool
    steps: list | None = None


class _Batcher:
    """An engine's scheduler in small: the requests in flight together are served as one batch (the
    first, and those arriving within the model's ``batch_window`` after it, at most ``max_batch``)."""

    def __init__(self, model: ToyServedModel):
        import queue
        self.model, self.queue = model, queue.Queue()
        threading.Thread(target=self._serve, daemon=True).start()

    def submit(self, row: _Row):
        done, box = threading.Event(), []
        self.queue.put((row, done, box))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _serve(self) -> None:
        import queue
        import time
        while True:
            batch = [self.queue.get()]
            deadline = time.monotonic() + self.model.batch_window
            while len(batch) < self.model.max_batch:
                left = deadline - time.monotonic()
                try:
                    batch.append(self.queue.get(timeout=max(left, 0)) if left > 0 else self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                results = self.model.generate_rows([row for row, _, _ in batch])
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting request
                results = [exc] * len(batch)
            for (_, done, box), result in zip(batch, results):
                box.append(result)
                done.set()


def _seeded(body: dict) -> bool:
    seed = body.get("seed")
    return isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0


EOS_TEXT = "<eos>"  # the end-of-generation token's text, as /props names it (its own text: none in an answer's)


def _without_eos(model: ToyServedModel, tokens: list[int]) -> list[int]:
    return [t for t in tokens if t != model.eos] if model.eos is not None else tokens


def _seed_of(body: dict) -> int:
    """A request's seed; none (or llama.cpp's -1) is a fresh one from the OS, as a real server draws
    for an unseeded request."""
    seed = body.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return seed
    return int(np.random.default_rng().integers(2 ** 31))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sample(p: np.ndarray, rng: np.random.Generator) -> int:
    return int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"), p.size - 1))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    model: ToyServedModel
    requests: Counter


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, status: int, data) -> None:
        text = isinstance(data, str)
        body = (data if text else json.dumps(data)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4" if text else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.server.requests[self.path] += 1
        self._reply(*respond(self.server.model, self.path, None))

    def do_POST(self):
        self.server.requests[self.path] += 1
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        except ValueError:
            return self._reply(400, {"error": "not JSON"})
        status, answer = respond(self.server.model, self.path, body)
        if status == 200 and body.get("stream") and isinstance(answer, dict) and "events" in answer:
            return self._stream(answer["events"], done=self.path != "/completion")
        self._reply(status, answer)

    def _stream(self, events: list[dict], done: bool) -> None:
        """Server-sent events, one ``data:`` line each (OpenAI's routes end with ``data: [DONE]``)."""
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + ("data: [DONE]\n\n" if done else "")
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def respond(model: ToyServedModel, path: str, body: dict | None) -> tuple[int, dict | list | str]:
    """(HTTP status, answer) of the served model to a GET (``body`` None) or a POST: JSON, or text
    (a ``str``: vLLM's ``/metrics``, mlx-lm's ``Not Found``)."""
    if model.api in ("mlx-lm", "llama-cpp-python"):  # the text-prompt dialects: toy_models.served_text
        from toy_models.served_text import text_respond
        return text_respond(model, path, body)
    several = _several(body, path)
    if several > 1:
        return _respond_several(model, path, body, several)
    if body is None:
        if path == "/health":
            return 200, {"status": "ok"}
        if path == "/get_server_info" and model.server_info is not None:
            return 200, dict(model.server_info)
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": _model_name(model), "object": "model"}]}
        if model.api == "vllm":
            if path == "/metrics":
                return 200, _metrics(model)  # Prometheus text, not JSON
            return 404, {"error": "not found"}
        if path == "/props":
            props = {"model_path": _model_name(model), "n_vocab": model.vocab, "speculative": model.speculative}
            return 200, {**props, "eos_token": EOS_TEXT} if model.eos is not None else props
        if path == "/slots":
            return 200, [{"id": 0, "speculative": model.speculative,
                          "params": {"speculative.types": "none,draft-simple" if model.speculative else "none"}}]
        return 404, {"error": "not found"}
    if path == "/v1/completions":
        return _openai_completion(model, body)
    if path == "/v1/chat/completions":
        return _chat_completion(model, body)
    if path == "/tokenize" and model.api == "vllm" and "messages" in body:
        if model.chat == "none":
            return 400, _NO_TEMPLATE
        ids = chat_template_ids(model, body["messages"])
        return 200, {"count": len(ids), "max_model_len": 512, "tokens": ids}
    if path == "/apply-template" and model.api == "llama.cpp":
        if model.chat == "none":
            return 400, _NO_TEMPLATE
        return 200, {"prompt": _render(model, body.get("messages") or [])}
    if model.api == "vllm" and path == "/detokenize":
        return 200, {"prompt": "".join(token_text(t) for t in body.get("tokens") or [])}
    if model.api == "vllm":
        return 404, {"error": "not found"}
    if path == "/tokenize":
        content = str(body.get("content", ""))
        if model.eos is not None and body.get("parse_special") and content == EOS_TEXT:
            return 200, {"tokens": [model.eos]}
        return 200, {"tokens": [ord(c) % model.vocab for c in content]}
    if path == "/detokenize":
        return 200, {"content": "".join(token_text(t) for t in body.get("tokens") or [])}
    if path != "/completion":
        return 404, {"error": "not found"}
    prompt = body.get("prompt")
    if not _token_ids(model, prompt):
        return 400, {"error": "prompt must be token ids"}
    try:
        sampling = _sampling(body)
    except ValueError as exc:
        return 400, {"error": {"code": 400, "message": str(exc), "type": "invalid_request_error"}}
    n_predict = max(0, min(int(body.get("n_predict", 16)), 256))
    forced = [t for t, bias in body.get("logit_bias") or [] if isinstance(bias, (int, float)) and bias >= 100]
    steps: list[int] = []
    if forced:  # a logit bias that large decides every token (what the audit uses it for: a token's piece)
        tokens, drafted, accepted, found = [int(forced[0])] * n_predict, 0, 0, None
    else:
        tokens, drafted, accepted, found = model.generate_request(prompt, n_predict, sampling, body, steps)
    answer = {"tokens": tokens, "content": _cut(_without_eos(model, tokens), found),
              "stop_type": "word" if found else "eos" if model.ended(tokens, sampling) else "limit",
              "stopping_word": found or "", "timings": _timings(tokens, drafted, accepted),
              "tokens_predicted": model.counted(tokens, drafted, accepted)}
    n_probs = int(body.get("n_probs", 0) or 0)
    if n_probs:
        answer["completion_probabilities"] = _llama_entries(model, prompt, tokens, sampling, n_probs,
                                                            bool(body.get("post_sampling_probs")))
    if body.get("stream"):
        return 200, {"events": _llama_events(answer, steps)}
    return 200, answer


def _segments(tokens: list[int], steps: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each speculation step's tokens: what one streamed event carries."""
    ends = sorted({min(e, len(tokens)) for e in steps if e > 0} | {len(tokens)})
    starts = [0] + ends[:-1]
    return [(a, b) for a, b in zip(starts, ends) if b > a]


def _llama_events(answer: dict, steps: list[int]) -> list[dict]:
    """llama.cpp's /completion streamed: one event per speculation step (its tokens, their text,
    their probabilities), then the final event (``stop: true``, the stop type, the timings, the
    tokens predicted). The text of each event is its tokens' text, cut where the answer's is."""
    tokens, content = answer["tokens"], answer["content"]
    entries = answer.get("completion_probabilities")
    events = []
    for a, b in _segments(tokens, steps):
        event = {"index": 0, "content": content[a:b], "tokens": tokens[a:b], "stop": False}
        if entries is not None:
            event["completion_probabilities"] = entries[a:b]
        events.append(event)
    final = {k: v for k, v in answer.items() if k not in ("tokens", "content", "completion_probabilities")}
    events.append({**final, "index": 0, "content": "", "tokens": [], "stop": True,
                   "tokens_predicted": answer.get("tokens_predicted", len(tokens))})
    return events


def token_text(token: int) -> str:
    """A token's text (its letter, a to z): what the toy's detokenizer, its chat answers and its
    stop strings read."""
    return chr(97 + int(token) % 26)


def _cut(tokens: list[int], found: str | None) -> str:
    """The answer's text: the continuation's, cut before the stop string found (as engines return it)."""
    text = "".join(token_text(t) for t in tokens)
    return text[:text.find(found)] if found else text


def _several(body: dict | None, path: str) -> int:
    """How many samples a completion request asks (llama.cpp's /completion: ``n_cmpl``, or its alias
    ``n``; /v1/completions: ``n``); 1 for anything else."""
    if body is None or path not in ("/completion", "/v1/completions"):
        return 1
    value = body.get("n_cmpl", body.get("n", 1)) if path == "/completion" else body.get("n", 1)
    return max(1, int(value or 1))


def _respond_several(model: ToyServedModel, path: str, body: dict, k: int) -> tuple[int, dict | list]:
    """``k`` samples of one request, sample j seeded seed + j (``several_mutant="same_seed"``: all
    with the request's seed): llama.cpp's /completion answers a list of results with their
    ``index``, /v1/completions one answer whose ``choices`` are indexed 0..k-1."""
    seed = _seed_of(body)
    answers = []
    for j in range(k):
        one = {key: v for key, v in body.items() if key not in ("n", "n_cmpl")}
        one["seed"] = seed if model.several_mutant == "same_seed" else seed + j
        status, answer = respond(model, path, one)
        if status != 200:
            return status, answer
        answers.append(answer)
    if path == "/completion":
        return 200, [dict(a, index=j) for j, a in enumerate(answers)]
    merged = dict(answers[0], choices=[dict(a["choices"][0], index=j) for j, a in enumerate(answers)])
    return 200, merged


_NO_TEMPLATE = {"error": {"code": 400, "type": "invalid_request_error",
                          "message": "As of transformers v4.44, default chat template is no longer allowed, so you "
                                     "must provide a chat template if the tokenizer does not define one."}}
_ROLES = {"system": 3, "user": 2, "assistant": 1}  # a role's token: vocab minus this (others: vocab - 4)


def _role_token(model: ToyServedModel, role: str) -> int:
    return model.vocab - _ROLES.get(role, 4)


def _render(model: ToyServedModel, messages: list[dict]) -> str:
    """The toy chat template as text: each message's role marker (a character whose code is its
    role token modulo the vocabulary, so ``/tokenize`` reads it back) and content, then the
    assistant's marker (the generation prompt)."""
    base = model.vocab * (0x2000 // model.vocab + 1)
    marks = [chr(base + _role_token(model, str(m.get("role")))) + str(m.get("content", "")) for m in messages]
    return "".join(marks) + chr(base + _role_token(model, "assistant"))


def chat_template_ids(model: ToyServedModel, messages: list[dict]) -> list[int]:
    """The token ids the toy chat template makes of ``messages``."""
    return [ord(c) % model.vocab for c in _render(model, messages)]


def _chat_completion(model: ToyServedModel, body: dict) -> tuple[int, dict]:
    """``/v1/chat/completions`` as llama.cpp or vLLM answers it (``chat``: with ids, text only, no template)."""
    if model.chat == "none":
        return 400, _NO_TEMPLATE
    if body.get("model") not in (None, _model_name(model)):
        return 404, {"error": {"message": f"the model {body.get('model')} does not exist", "code": 404}}
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return 400, {"error": {"message": "'messages' is required", "code": 400}}
    prompt = chat_template_ids(model, messages)
    sampling = {"temperature": float(body.get("temperature", 1.0)), "top_k": int(body.get("top_k", 0) or 0),
                "top_p": float(body.get("top_p", 1.0)), "min_p": float(body.get("min_p", 0.0)), **_ending(body)}
    sampling = _with_penalties(sampling, Penalties.llama_cpp(body) if model.api == "llama.cpp"
                               else Penalties.vllm(body, len(prompt)))
    n = max(0, min(int(body.get("max_tokens", 16)), 256))
    tokens, drafted, accepted = model.complete(prompt, n, sampling, _seed_of(body))
    choice = {"index": 0, "message": {"role": "assistant", "content": "".join(token_text(t) for t in tokens)},
              "finish_reason": "length"}
    answer = {"object": "chat.completion", "model": _model_name(model), "choices": [choice],
              "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens)}}
    with_logprobs = bool(body.get("logprobs")) and model.chat == "ids"
    if model.api == "llama.cpp":
        answer["timings"] = _timings(tokens, drafted, accepted)
        n_probs = int(body.get("top_logprobs", 20) or 0)  # llama.cpp: top_logprobs is n_probs, default 20
        if with_logprobs and n_probs > 0:
            choice["logprobs"] = {"content": _llama_entries(model, prompt, tokens, sampling, n_probs,
                                                            bool(body.get("post_sampling_probs")))}
        return 200, answer
    if body.get("return_token_ids") and model.chat == "ids":
        answer["prompt_token_ids"] = prompt
        choice["token_ids"] = list(tokens)
    if with_logprobs:
        name = (lambda i: f"token_id:{i}") if body.get("return_tokens_as_token_ids") else (lambda i: chr(97 + i % 26))
        entries, context = [], list(prompt)
        for token in tokens:
            raw = model.row(model.target, context)  # raw logprobs, as vLLM's default
            order = np.lexsort((np.arange(raw.size), -raw))[:int(body.get("top_logprobs") or 0)]
            entries.append({"token": name(token), "logprob": float(np.float32(np.log(raw[token]))),
                            "top_logprobs": [{"token": name(i), "logprob": float(np.float32(np.log(raw[i])))}
                                             for i in order if raw[i] > 0]})
            context.append(token)
        choice["logprobs"] = {"content": entries}
    return 200, answer


def _timings(tokens: list[int], drafted: int, accepted: int) -> dict:
    """llama.cpp's ``timings``: the draft counters only on a request that drafted (server-task.cpp,
    ``if (draft_n > 0)``)."""
    timings = {"predicted_n": len(tokens)}
    if drafted > 0:
        timings.update(draft_n=drafted, draft_n_accepted=accepted)
    return timings


def _model_name(model: ToyServedModel) -> str:
    return f"toy-served-v{model.vocab}-seed{model.seed}"


def _metrics(model: ToyServedModel) -> str:
    with model.lock:
        drafted, accepted = model.totals
    return (f"# TYPE vllm:spec_decode_num_draft_tokens counter\n"
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{_model_name(model)}"}} {drafted:.1f}\n'
            f"# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{_model_name(model)}"}} {accepted:.1f}\n')


def _token_ids(model: ToyServedModel, prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < model.vocab for t in prompt)


def _sampling(body: dict, api: str = "llama.cpp") -> dict:
    sampling = {"temperature": float(body.get("temperature", 0.8)), "top_k": int(body.get("top_k", 40) or 0),
                "top_p": float(body.get("top_p", 0.95)), "min_p": float(body.get("min_p", 0.05)),
                **_ending(body), **_constraint_of(body, api)}
    return _with_penalties(sampling, Penalties.llama_cpp(body))


def _constraint_of(settings: dict, api: str | None = None) -> dict:
    """The request's constraint (``api`` given: read from its body, ``served_constraints.from_body``;
    else the one a sampling dict holds) as a sampling entry; none: empty."""
    constraint = settings.get("constraint") if api is None else from_body(settings, api)
    return {"constraint": constraint} if constraint is not None else {}


_CHAIN = ("temperature", "top_k", "top_p", "min_p")


def _chain(sampling: dict) -> dict:
    """The sampler chain's own settings (the penalties and the end-of-generation settings left out)."""
    return {k: v for k, v in sampling.items() if k in _CHAIN}


def _ending(settings: dict) -> dict:
    """A request's end-of-generation settings: ``ignore_eos`` (its default off, as the engines'), and
    ``min_tokens`` where it asks some."""
    out = {"ignore_eos": bool(settings.get("ignore_eos", False))}
    if settings.get("min_tokens"):
        out["min_tokens"] = int(settings["min_tokens"])
    return out


def _with_penalties(sampling: dict, penalties: "Penalties | None") -> dict:
    return {**sampling, "penalties": penalties} if penalties is not None else sampling


def _centred_logits(p: np.ndarray) -> np.ndarray:
    """Logits of ``p`` with both signs (log p minus its mean over the tokens of positive
    probability), as a model's are: a sign-dependent penalty then acts as it does on an engine's."""
    with np.errstate(divide="ignore"):
        logp = np.log(p)
    return logp - logp[p > 0].mean()


@dataclass(frozen=True)
class Penalties:
    """A request's penalties by its engine's convention, applied to the target's logits before the
    sampler chain (float64). ``"llama.cpp"`` (sampling.cpp ``llama_sampler_init_penalties``, fed
    every prompt token by server-context.cpp ``init_sampler``): all three read the last ``last_n``
    tokens of prompt + output (-1: all of them, 0: none). ``"vllm"`` (``apply_penalties``): the
    repetition penalty reads the prompt and output as one set, presence and frequency the output
    only (the tokens after the first ``n_prompt``)."""

    convention: str
    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0
    last_n: int = 64
    n_prompt: int = 0

    @classmethod
    def llama_cpp(cls, body: dict) -> "Penalties | None":
        p = cls("llama.cpp", float(body.get("repeat_penalty", 1.0)), float(body.get("presence_penalty", 0.0)),
                float(body.get("frequency_penalty", 0.0)), int(body.get("repeat_last_n", 64)))
        return p if p.on else None

    @classmethod
    def vllm(cls, body: dict, n_prompt: int) -> "Penalties | None":
        p = cls("vllm", float(body.get("repetition_penalty", 1.0)), float(body.get("presence_penalty", 0.0)),
                float(body.get("frequency_penalty", 0.0)), n_prompt=n_prompt)
        return p if p.on else None

    @property
    def on(self) -> bool:
        return self.repetition != 1.0 or bool(self.presence) or bool(self.frequency)

    def apply(self, p: np.ndarray, context: list[int]) -> np.ndarray:
        if self.convention == "llama.cpp":
            window = list(context) if self.last_n < 0 else list(context)[len(context) - self.last_n:] \
                if self.last_n else []
            repeated, counted = set(window), Counter(window)
        else:
            repeated, counted = set(context), Counter(list(context)[self.n_prompt:])
        x = _centred_logits(np.asarray(p, dtype=np.float64))
        for t in repeated:
            x[t] = x[t] / self.repetition if x[t] > 0 else x[t] * self.repetition
        for t, c in counted.items():
            x[t] -= self.presence + self.frequency * c
        return _softmax(x)


def _llama_entries(model, prompt, tokens, sampling, n_probs, post_sampling: bool) -> list[dict]:
    entries, context = [], list(prompt)
    for token in tokens:
        law = model.law(context, sampling) if post_sampling else model.row(model.target, context)
        order = np.lexsort((np.arange(law.size), -law))[:n_probs]
        if post_sampling:
            entries.append({"id": token, "prob": float(np.float32(law[token])),
                            "top_probs": [{"id": int(i), "prob": float(np.float32(law[i]))} for i in order if law[i] > 0]})
        else:
            entries.append({"id": token, "logprob": float(np.float32(np.log(law[token]))),
                            "top_logprobs": [{"id": int(i), "logprob": float(np.float32(np.log(law[i])))}
                                             for i in order if law[i] > 0]})
        context.append(token)
    return entries


def _openai_completion(model: ToyServedModel, body: dict) -> tuple[int, dict]:
    """``/v1/completions`` as llama.cpp (``api="llama.cpp"``) or vLLM (``"vllm"``) answers it."""
    prompt = body.get("prompt")
    if body.get("model") not in (None, _model_name(model)):
        return 404, {"error": {"message": f"the model {body.get('model')} does not exist", "code": 404}}
    if not _token_ids(model, prompt):
        return 400, {"error": {"message": "prompt must be token ids", "code": 400}}
    # the OpenAI defaults: temperature 1, top_p 1, no top-k or min-p unless asked
    try:
        constraint = _constraint_of(body, model.api)
    except ValueError as exc:
        return 400, {"error": {"message": str(exc), "code": 400}}
    sampling = {"temperature": float(body.get("temperature", 1.0)), "top_k": int(body.get("top_k", 0) or 0),
                "top_p": float(body.get("top_p", 1.0)), "min_p": float(body.get("min_p", 0.0)), **_ending(body),
                **constraint}
    sampling = _with_penalties(sampling, Penalties.llama_cpp(body) if model.api == "llama.cpp"
                               else Penalties.vllm(body, len(prompt)))
    n = max(0, min(int(body.get("max_tokens", 16)), 256))
    steps: list[int] = []
    tokens, drafted, accepted, found = model.generate_request(prompt, n, sampling, body, steps)
    choice = {"index": 0, "text": _cut(_without_eos(model, tokens), found), "logprobs": None,
              "finish_reason": "stop" if found or model.ended(tokens, sampling) else "length", "stop_reason": found}
    answer = {"object": "text_completion", "model": _model_name(model), "choices": [choice],
              "usage": {"prompt_tokens": len(prompt), "completion_tokens": model.counted(tokens, drafted, accepted)}}
    logprobs = body.get("logprobs")
    if model.api == "llama.cpp":
        answer["timings"] = _timings(tokens, drafted, accepted)
        if logprobs is not None and int(logprobs) > 0:
            choice["logprobs"] = {"content": _llama_entries(model, prompt, tokens, sampling, int(logprobs),
                                                            bool(body.get("post_sampling_probs")))}
        return 200, ({"events": _openai_events(answer, steps, body)} if body.get("stream") else answer)
    if body.get("return_token_ids"):
        choice["token_ids"] = list(tokens)
    if logprobs is not None:
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        name = (lambda i: f"token_id:{i}") if as_ids else (lambda i: chr(97 + int(i) % 26))
        rows, context = [], list(prompt)
        for token in tokens:
            raw = model.row(model.target, context)  # vLLM's default logprobs_mode: raw_logprobs
            order = np.lexsort((np.arange(raw.size), -raw))[:int(logprobs)]
            rows.append((token, float(np.float32(np.log(raw[token]))),
                         {name(i): float(np.float32(np.log(raw[i]))) for i in order if raw[i] > 0}))
            context.append(token)
        choice["logprobs"] = {"tokens": [name(t) for t, _, _ in rows], "token_logprobs": [lp for _, lp, _ in rows],
                              "top_logprobs": [top for _, _, top in rows], "text_offset": [0] * len(rows)}
    return 200, ({"events": _openai_events(answer, steps, body)} if body.get("stream") else answer)


def _openai_events(answer: dict, steps: list[int], body: dict) -> list[dict]:
    """/v1/completions streamed: one chunk per speculation step (``choices[0]``: its text, its
    ``token_ids``, its slice of each logprobs list), a chunk with the finish reason, and, asked by
    ``stream_options.include_usage``, one with no choices and the usage."""
    choice = answer["choices"][0]
    text, ids, logprobs = choice["text"], choice.get("token_ids"), choice.get("logprobs")
    count = answer["usage"]["completion_tokens"]
    events = []
    for a, b in _segments(list(range(count)), steps):
        delta = {"index": 0, "text": text[a:b], "logprobs": None, "finish_reason": None}
        if ids is not None:
            delta["token_ids"] = ids[a:b]
        if logprobs is not None:
            delta["logprobs"] = {k: v[a:b] for k, v in logprobs.items() if isinstance(v, list)}
        events.append({"object": "text_completion", "model": answer["model"], "choices": [delta]})
    final = {"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"],
             "stop_reason": choice.get("stop_reason")}
    events.append({"object": "text_completion", "model": answer["model"], "choices": [final],
                   **({"timings": answer["timings"]} if "timings" in answer else {})})
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({"object": "text_completion", "model": answer["model"], "choices": [], "usage": answer["usage"]})
    return events


class served_model(LoopbackServer):
    """``with served_model(ToyServedModel(...)) as server: server.url, server.requests``: the model
    served on 127.0.0.1 (a free port) until the block ends."""

    def __init__(self, model: ToyServedModel):
        self.model = model

    def __enter__(self) -> "served_model":
        server = _Server(("127.0.0.1", 0), _Handler)
        server.model = self.model
        server.requests = Counter()
        self.serve(server)
        return self

    @property
    def requests(self) -> Counter:
        return self.server.requests
