"""What a text-prompt server (mlx-lm's, llama-cpp-python's) can be asked, through the tokenizer of
the model directory it serves.

Such a server takes a prompt as text and tokenizes it itself. The audit's worlds and laws are over
token ids, so every prompt and every prefix a law expansion wants is written as the text the
directory's tokenizer decodes it to, and used only where that text encodes back to the same ids
(``TextPrompts.text``). With a WordLevel tokenizer every sequence of ids passes; with a byte-level
BPE (every real model's) many do not: ``t`` ``he`` decodes to ``the``, which encodes to the one id
``the``, and a lone byte of a multi-byte character decodes to no text at all. Such ids are
``Inexpressible``: a law expansion leaves the prefix as one pooled cell of its exact mass
(``continuation_law.expand``), the logprobs of a token after it are not compared, and greedy paths
built one token at a time stop there; none of it is ever a usage error once the audit has started.

A server that keys its logprobs by a token's text (llama-cpp-python: ``detokenize([id])`` decoded as
UTF-8 with errors ignored) names several ids with one string: ``TextPrompts.ids_of_string`` says
which, from the directory's tokenizer, and a string of several ids is stated as such (those ids stay
in a merged cell of the law), never guessed.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Sequence

from exactcheck.endpoints.client import EndpointError
from exactcheck.endpoints.continuation_law import Unaskable
from exactcheck.endpoints.sampler_law import NotDeterminable

__all__ = ["Inexpressible", "TextPrompts", "load_tokenizer", "byte_level_alphabet", "one_token_path"]


class Inexpressible(NotDeterminable, Unaskable):
    """Token ids with no text that the server's tokenizer reads back as the same ids: a text-prompt
    server cannot be sent them as a prompt (the law after them is not asked; not a usage error)."""

    def __init__(self, ids: Sequence[int], directory):
        self.ids = tuple(int(i) for i in ids)
        self.reason = (f"the server takes text prompts, and these prefixes have no text that the tokenizer of "
                       f"{directory} reads back as their ids (a byte-level BPE merges or splits them)")
        super().__init__(f"the token ids {list(self.ids)[-8:]} have no text that {directory}'s tokenizer reads back "
                         f"as the same ids (a text-prompt server cannot be sent them)")


@functools.lru_cache(maxsize=8)
def load_tokenizer(directory: str):
    """The tokenizer of a model directory, as transformers loads it (cached; one line if it cannot)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise EndpointError("reading a model directory's tokenizer needs transformers (pip install transformers)") from None
    try:
        return AutoTokenizer.from_pretrained(directory)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the user's directory
        raise EndpointError(f"cannot load the tokenizer of {directory}: {str(exc).splitlines()[0][:160]}") from None


@functools.lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, read backwards: the character a byte-level BPE writes for each
    byte -> the byte. Printable Latin-1 bytes stand for themselves; the others (controls, space,
    the rest) are given the characters from U+0100 upwards, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


class TextPrompts:
    """The tokenizer of the model directory a text-prompt server serves, as the audit uses it."""

    def __init__(self, directory: Path | str):
        self.directory = Path(directory)
        self.tokenizer = load_tokenizer(str(self.directory))
        self.vocab_size = len(self.tokenizer)
        self._texts: dict[tuple[int, ...], str | None] = {}
        self._strings: dict[str, frozenset[int]] | None = None

    # --- prompts

    def text(self, ids: Sequence[int]) -> str | None:
        """The text the tokenizer decodes ``ids`` to, None where it does not encode back to them."""
        key = tuple(int(i) for i in ids)
        if not all(0 <= i < self.vocab_size for i in key):  # a merged cell's marker: which id it was is not known
            return None
        if key not in self._texts:
            text = self.tokenizer.decode(list(key), skip_special_tokens=False, clean_up_tokenization_spaces=False)
            back = self.tokenizer.encode(text, add_special_tokens=False)
            self._texts[key] = text if tuple(back) == key else None
        return self._texts[key]

    def require(self, ids: Sequence[int]) -> str:
        """``text(ids)``, or ``Inexpressible``."""
        text = self.text(ids)
        if text is None:
            raise Inexpressible(ids, self.directory)
        return text

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` without the tokens the server adds (a BOS)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def expressible_depth(self, prompt: Sequence[int], tokens: Sequence[int]) -> int:
        """How many of ``tokens`` can be followed by a one-token request: the largest ``d`` such
        that ``prompt + tokens[:t]`` has a text for every ``t <= d`` (reading stops at the first that
        has none)."""
        depth = 0
        while depth < len(tokens) and self.text(list(prompt) + list(tokens[:depth + 1])) is not None:
            depth += 1
        return depth

    # --- string-keyed logprobs

    def piece(self, token: int) -> bytes:
        """The bytes a server renders one token as (special tokens: none, as llama.cpp's
        ``detokenize(..., special=False)``): a byte-level BPE's through GPT-2's alphabet, a
        SentencePiece's with ``▁`` as a space and ``<0xNN>`` as that byte."""
        token = int(token)
        if token in set(self.tokenizer.all_special_ids):
            return b""
        name = self.tokenizer.convert_ids_to_tokens(token)
        if name is None:
            return b""
        alphabet = byte_level_alphabet()
        if self._byte_level:
            if not all(c in alphabet for c in name):
                raise NotDeterminable(f"token {token} ({name!r}) is not written in the byte-level alphabet")
            return bytes(alphabet[c] for c in name)
        if len(name) == 6 and name.startswith("<0x") and name.endswith(">"):
            return bytes([int(name[3:5], 16)])
        return name.replace("\u2581", " ").encode("utf-8")

    @functools.cached_property
    def _byte_level(self) -> bool:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        return type(decoder).__name__ == "ByteLevel"

    def string(self, token: int) -> str:
        """A token's text as llama-cpp-python keys its logprobs: its bytes decoded as UTF-8, the
        bytes that do not decode dropped (``errors="ignore"``)."""
        return self.piece(token).decode("utf-8", errors="ignore")

    def ids_of_string(self, string: str) -> frozenset[int]:
        """Every id whose text (``string``) is ``string``: one id, several (a merged cell), or none."""
        if self._strings is None:
            strings: dict[str, set[int]] = {}
            for token in range(self.vocab_size):
                strings.setdefault(self.string(token), set()).add(token)
            self._strings = {s: frozenset(ids) for s, ids in strings.items()}
        return self._strings.get(string, frozenset())

    def shared_strings(self) -> int:
        """How many ids share their text with another id (what string-keyed logprobs cannot tell apart)."""
        self.ids_of_string("")
        return sum(len(ids) for ids in self._strings.values() if len(ids) > 1)


def one_token_path(endpoint, prompt: Sequence[int], tokens: int) -> tuple[tuple[int, ...], str | None]:
    """Greedy decoding by one-token requests to ``endpoint`` (each answered by the target alone): the
    path of up to ``tokens`` tokens, and why it stops short (None: it did not), which is at the
    first prefix a text-prompt server cannot be sent (``Inexpressible``), never a usage error."""
    from exactcheck.endpoints.endpoint import GREEDY_SAMPLING
    path: list[int] = []
    while len(path) < tokens:
        try:
            body = endpoint.body(list(prompt) + path, 1, GREEDY_SAMPLING, 0)
        except Inexpressible as exc:
            return tuple(path), f"the greedy path built one token at a time stops after {len(path)} tokens: {exc.reason}"
        (c,) = endpoint.complete_many([body])
        if not c.tokens:
            break
        path.append(c.tokens[0])
        if c.stopped_on_eog:
            break
    return tuple(path), None
