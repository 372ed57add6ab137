"""OpenAI's `logprobs` objects (and completions' `echo`) for one choice, from the engine's TokenLogprobs.

Shapes as OpenAI's API and vLLM answer them (vllm/entrypoints/openai/serving_chat.py `_create_chat_logprobs`,
`_get_top_logprobs`; serving_completion.py `_create_completion_logprobs`; protocol.py `ChatCompletionLogProbs`,
`CompletionLogProbs`):
- chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}],
  "refusal": null}; `bytes` is the token text's UTF-8 (as vLLM), except for a token that is part of a character
  (text U+FFFD), whose own bytes come from its vocabulary entry where its form says them (byte-level BPE,
  SentencePiece byte fallback), so clients can join them; top_logprobs the k most likely.
- completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}, ...], "text_offset"}; each
  top_logprobs entry holds the k most likely and the sampled token (so up to k + 1, as OpenAI documents);
  with echo the prompt's tokens come first, the very first with null logprob and null top_logprobs.
  text_offset is each token's offset into the choice's text (which holds the prompt when echoed), running
  across stream chunks, as vLLM counts it (the sum of the decoded tokens' lengths).
Log-probabilities below -9999 (float -inf included, which JSON cannot carry) are clamped to -9999, as vLLM does.
Streamed, a chunk carries the entries of the tokens it delivers; tokens whose text is held back (a partial
character, a possible stop string) have theirs delivered with the chunk that carries their text.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import orjson

from inferd.api.wire.responses import ChunkEncoder
from inferd.engine import StreamWrapper
from inferd.types import Delta, TokenLogprob

_FLOOR = -9999.0
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")      # SentencePiece's byte fallback


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet (printable stand-ins for the 256 byte values), char -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(map(chr, keep), keep)), 0
    for b in range(256):
        if b not in keep:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()


def token_bytes(vocab_entry: str | None) -> bytes | None:
    """A token's own bytes from its vocabulary entry, for a token that is part of a character (its decoded text
    is U+FFFD): OpenAI's `bytes` exist so such pieces can be joined. None when the entry's form is unknown."""
    if vocab_entry is None:
        return None
    m = _BYTE_TOKEN.fullmatch(vocab_entry)
    if m:
        return bytes([int(m.group(1), 16)])
    if all(c in _BYTE_LEVEL for c in vocab_entry):
        return bytes(_BYTE_LEVEL[c] for c in vocab_entry)
    return None


class LogprobFormat:
    """One choice's pending log-probabilities (and echoed prompt) until a chunk or body takes them."""

    __slots__ = ("_chat", "_top", "_decode", "_names", "_echo", "_prompt_first", "_pending", "_offset", "wants",
                 "_vocab_entry")

    def __init__(self, kind: str, top: int | None, decode: Callable[[list[int]], str], *,
                 echo_text: str | None = None, prompt_ids: Sequence[int] = (),
                 vocab_entry: Callable[[int], str | None] | None = None) -> None:
        self._chat = kind == "chat"
        self._top = top or 0
        self.wants = top is not None            # the client asked for log-probabilities (not just echo)
        self._decode = decode
        self._vocab_entry = vocab_entry         # token id -> its vocabulary entry (exact bytes of partial characters)
        self._names: dict[int, str] = {}
        self._echo = echo_text                  # sent once, before the first output text
        self._prompt_first = prompt_ids[0] if prompt_ids else 0
        self._pending: list[TokenLogprob | int] = []   # an int: a token with no log-probability (prompt's first)
        self._offset = 0

    def add(self, delta: Delta) -> None:
        """Keep what `delta` brings (a stream wrapper calls this as each delta is read)."""
        if not self.wants:
            return
        if delta.prompt_logprobs is not None and self._echo is not None:
            self._pending.extend(self._prompt_first if e is None else e for e in delta.prompt_logprobs)
        if delta.logprobs is not None:
            self._pending.extend(delta.logprobs)

    def text(self, text: str) -> str:
        """`text`, after the echoed prompt the first time."""
        echo = self._echo
        if echo is None:
            return text
        self._echo = None
        return echo + text

    def take(self, always: bool = False) -> dict | None:
        """The logprobs object of everything pending (None when nothing is, unless `always`)."""
        if not self.wants or (not self._pending and not always):
            return None
        pending, self._pending = self._pending, []
        return self._chat_object(pending) if self._chat else self._completion_object(pending)

    def _name(self, token_id: int) -> str:
        name = self._names.get(token_id)
        if name is None:
            name = self._names[token_id] = self._decode([token_id])
        return name

    def _chat_item(self, token_id: int, logprob: float) -> dict:
        token = self._name(token_id)
        raw = None
        if "\ufffd" in token and self._vocab_entry is not None:
            raw = token_bytes(self._vocab_entry(token_id))
        # vLLM sends the decoded text's UTF-8 (a partial character as U+FFFD's); the token's own bytes are
        # what OpenAI's field is for, where the vocabulary says them
        return {"token": token, "logprob": max(logprob, _FLOOR),
                "bytes": list(raw if raw is not None else token.encode("utf-8", "replace"))}

    def _chat_object(self, pending: list) -> dict:
        content = []
        for e in pending:
            item = self._chat_item(e.token_id, e.logprob)
            item["top_logprobs"] = [self._chat_item(t, v) for t, v in e.top[:self._top]]
            content.append(item)
        return {"content": content, "refusal": None}

    def _completion_object(self, pending: list) -> dict:
        tokens, values, tops, offsets = [], [], [], []
        offset = self._offset
        for e in pending:
            if isinstance(e, int):
                token, value, top = self._name(e), None, None
            else:
                token, value = self._name(e.token_id), max(e.logprob, _FLOOR)
                top = {self._name(t): max(v, _FLOOR) for t, v in e.top[:self._top]}
                top.setdefault(token, value)
            tokens.append(token)
            values.append(value)
            tops.append(top)
            offsets.append(offset)
            offset += len(token)
        self._offset = offset
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


class LogprobStream(StreamWrapper):
    """A choice's stream, unchanged, feeding its LogprobFormat each delta read (streamed or collected)."""

    def __init__(self, inner, fmt: LogprobFormat) -> None:
        super().__init__(inner)
        self.format = fmt

    def _read(self, delta: Delta) -> Delta:
        self.format.add(delta)
        return delta


class LogprobChunkEncoder(ChunkEncoder):
    """ChunkEncoder for requests with logprobs or echo: each chunk carries its tokens' logprobs object and the
    first the echoed prompt. A separate class so the plain encoder's frames and speed stay as they are."""

    __slots__ = ("_formats", "_format")

    def __init__(self, formats: list[LogprobFormat], ident, include_usage: bool, *, index: int = 0, **kw) -> None:
        super().__init__(ident, include_usage, index=index, **kw)
        self._formats = formats
        self._format = formats[index]

    def for_choice(self, index: int) -> LogprobChunkEncoder:
        return LogprobChunkEncoder(self._formats, self._ident, self._include_usage, index=index, running=self.running,
                                   usage_comment=self._usage_comment, hold_done=self.hold_done, timeline=self.timeline)

    def _parts(self, text: str) -> tuple[bytes, bytes, bytes]:
        """This chunk's prefix, its text as JSON (echo first) and its `mid` with the logprobs object in."""
        prefix = self._next_prefix
        self._next_prefix = self._prefix
        lp = self._format.take()
        mid = self._mid if lp is None else self._mid.replace(b'"logprobs":null', b'"logprobs":' + orjson.dumps(lp), 1)
        return prefix, orjson.dumps(self._format.text(text)), mid

    def content(self, text: str) -> bytes:
        prefix, body, mid = self._parts(text)
        return b"".join((prefix, body, mid, b"null", self._tail))

    def content_with_usage(self, text: str, tokens: int) -> bytes:
        prefix, body, mid = self._parts(text)
        return b"".join((prefix, body, mid, b'null}],"usage":', self.running.add(tokens), b"}\n\n"))

    def final(self, text: str, finish: str, tokens: int = 0) -> bytes:
        prefix, body, mid = self._parts(text)
        tail = self._tail if self.running is None else b'}],"usage":' + self.running.add(tokens) + b"}\n\n"
        return prefix + body + mid + b'"' + finish.encode() + b'"' + tail
