"""OpenAI wire format, response side: completion bodies, stream chunks, usage, Server-Timing.

Stream chunks are on the hot path: the constant part of each chunk (id, model, created, ...)
is encoded once per request and a chunk is `prefix + orjson(text) + suffix`, no dict per token.
"""
from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

import orjson

from inferd.api.errors import SERVER_ERROR, TIMEOUT, ApiError
from inferd.api.wire.endpoints import ENDPOINTS
from inferd.engine import DEAD_END
from inferd.types import EngineTiming, FinishReason, Usage

if TYPE_CHECKING:      # the pipeline's timeline: only its server_timing() is called here
    from inferd.api.pipeline.timeline import Timeline

_dumps = orjson.dumps
DONE_FRAME = b"data: [DONE]\n\n"
PING_FRAME = b": ping\n\n"

# Normal ends map onto OpenAI's values; abnormal ends are errors (see abnormal_end).
OPENAI_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
                 FinishReason.CONTENT_FILTER: "content_filter"}


def usage_dict(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def abnormal_end(reason: FinishReason, error: str | None) -> ApiError:
    """ABORT / DEADLINE / ERROR: OpenAI has no finish_reason for these, so they are errors.

    Non-streaming they are the response's status; streaming they are a final `error` frame
    (the OpenAI SDK raises APIError on it), so a cut-short output never looks complete.
    """
    if reason is FinishReason.DEADLINE:
        return ApiError(504, "The request's deadline passed before it finished.", type=TIMEOUT,
                        code="deadline_exceeded")
    if reason is FinishReason.ABORT:
        return ApiError(503, "The request was aborted by the server (shutting down, or an operator) "
                        "before it finished; retry it.", type=SERVER_ERROR, code="request_aborted",
                        headers={"Retry-After": "1"})
    if error == DEAD_END:       # the client's grammar asked for what no token can write: its fault, a 400
        return ApiError(400, f"The output's grammar (response_format or structured_outputs) {DEAD_END.removeprefix('the output ')}"
                        ": it asks for text no token can write (a JSON schema pattern requiring a raw control "
                        "character, say, which JSON strings cannot hold).", code="grammar_dead_end")
    return ApiError(500, f"The engine failed this request: {error or 'unknown error'}.", type=SERVER_ERROR,
                    code="engine_error")


class Identity:
    """The per-response constants every body and chunk repeats."""

    __slots__ = ("kind", "id", "created", "model", "fingerprint")

    def __init__(self, kind: str, id: str, created: int, model: str, fingerprint: str) -> None:
        self.kind = kind
        self.id = id
        self.created = created
        self.model = model
        self.fingerprint = fingerprint

    def header(self, object_name: str) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}


def new_identity(kind: str, model: str, fingerprint: str) -> Identity:
    """A response's constants with a fresh id (`chatcmpl-...` for chat, `resp_...` for the Responses API,
    `cmpl-...` else), made now."""
    return Identity(kind, ENDPOINTS[kind].id_prefix + secrets.token_hex(12), int(time.time()), model, fingerprint)


def completion_body(ident: Identity, choices: list[tuple[str | None, str]], usage: Usage,
                    logprobs: list[dict | None] | None = None, tool_calls: list[list[dict] | None] | None = None) -> bytes:
    """The whole (not streamed) response: `choices` are (text, finish_reason) in index order; `logprobs`
    each choice's logprobs object (inferd.api.wire.logprobs), when the request asked for them; `tool_calls`
    each chat choice's calls (inferd.api.wire.tool_stream), when tools were in play."""
    lps = logprobs or [None] * len(choices)
    if ident.kind == "chat":
        body = ident.header("chat.completion")
        body["choices"] = [{"index": i, "message": {"role": "assistant", "content": text, "refusal": None},
                            "logprobs": lp, "finish_reason": finish}
                           for i, ((text, finish), lp) in enumerate(zip(choices, lps))]
        for choice, calls in zip(body["choices"], tool_calls or ()):
            if calls:
                choice["message"]["tool_calls"] = calls
    else:
        body = ident.header("text_completion")
        body["choices"] = [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}
                           for i, ((text, finish), lp) in enumerate(zip(choices, lps))]
    body["usage"] = usage_dict(usage)
    return orjson.dumps(body)


class RunningUsage:
    """Tokens so far of one streamed response, for `stream_options.continuous_usage_stats` (as vLLM:
    every chunk carries the usage up to it). Shared by the encoders of a response's choices."""

    __slots__ = ("prompt_tokens", "completion_tokens")

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0

    def count(self, tokens: int) -> None:
        """Tokens the client was given without a chunk of their own (text held back by a stop string)."""
        self.completion_tokens += tokens

    def add(self, tokens: int) -> bytes:
        """Count `tokens` more and return the usage object as JSON."""
        self.completion_tokens += tokens
        return b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
            self.prompt_tokens, self.completion_tokens, self.prompt_tokens + self.completion_tokens)


class ChunkEncoder:
    """Builds the SSE frames of one streamed response (of its choice `index`)."""

    __slots__ = ("_ident", "_object", "_next_prefix", "_prefix", "_mid", "_tail", "_suffix", "_include_usage",
                 "_index", "running", "_usage_comment", "hold_done", "timeline")

    def __init__(self, ident: Identity, include_usage: bool, *, index: int = 0,
                 running: RunningUsage | None = None, usage_comment: bool = False, hold_done: bool = False,
                 timeline: Timeline | None = None) -> None:
        self._ident = ident
        self.timeline = timeline        # set: the stream ends with a `: server-timing` comment (see done)
        self._include_usage = include_usage
        self._usage_comment = usage_comment     # a forwarded stream: tell the origin node its usage
        # The ledger records the request before `[DONE]`: the writer sends it once the row is committed.
        self.hold_done = hold_done
        self._index = index
        self.running = running          # set: every chunk carries the usage so far
        chat = ident.kind == "chat"
        self._object = "chat.completion.chunk" if chat else "text_completion"
        head = orjson.dumps(ident.header(self._object))[:-1] + b',"choices":[{"index":%d,' % index
        head = b"data: " + head
        if chat:
            self._prefix = head + b'"delta":{"content":'
            # The first chunk announces the role, as OpenAI's does.
            self._next_prefix = head + b'"delta":{"role":"assistant","content":'
            self._mid = b'},"logprobs":null,"finish_reason":'
        else:
            self._prefix = self._next_prefix = head + b'"text":'
            self._mid = b',"logprobs":null,"finish_reason":'
        # With include_usage, OpenAI sends `"usage": null` on every chunk but the usage one.
        self._tail = (b'}],"usage":null}\n\n' if include_usage else b"}]}\n\n")
        self._suffix = self._mid + b"null" + self._tail

    def for_choice(self, index: int) -> ChunkEncoder:
        """The encoder of choice `index` of the same response (a list of prompts in /v1/completions)."""
        return ChunkEncoder(self._ident, self._include_usage, index=index, running=self.running,
                            usage_comment=self._usage_comment, hold_done=self.hold_done, timeline=self.timeline)

    @property
    def ident(self) -> Identity:
        return self._ident

    @property
    def include_usage(self) -> bool:
        return self._include_usage

    def mark_started(self) -> None:
        """Content chunks were encoded elsewhere (an SSE writer process): the next chunk is not the first."""
        self._next_prefix = self._prefix

    def content(self, text: str) -> bytes:
        prefix = self._next_prefix
        self._next_prefix = self._prefix
        return b"".join((prefix, _dumps(text), self._suffix))

    def content_with_usage(self, text: str, tokens: int) -> bytes:
        """content() carrying the usage so far, `tokens` more included (continuous usage stats)."""
        prefix = self._next_prefix
        self._next_prefix = self._prefix
        return b"".join((prefix, _dumps(text), self._mid, b'null}],"usage":', self.running.add(tokens), b"}\n\n"))

    def final(self, text: str, finish: str, tokens: int = 0) -> bytes:
        """The last content chunk of this choice: whatever text is left, and the finish_reason."""
        prefix = self._next_prefix
        self._next_prefix = self._prefix
        tail = self._tail if self.running is None else b'}],"usage":' + self.running.add(tokens) + b"}\n\n"
        return prefix + _dumps(text) + self._mid + b'"' + finish.encode() + b'"' + tail

    def usage(self, usage: Usage) -> bytes:
        body = self._ident.header(self._object)
        body["choices"] = []
        body["usage"] = usage_dict(usage)
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def done(self, usage: Usage | None, timing: EngineTiming | None = None) -> bytes:
        """`[DONE]` (nothing when `hold_done`: the writer sends it later). Before it, SSE comments, which
        clients ignore: the per-stage breakdown a JSON response has in its Server-Timing header
        (`: server-timing api;dur=...`, when `timeline` is set); for a stream a peer forwarded to us,
        the usage, which the forwarding node takes out (inferd.api.pipeline.spill)."""
        done = b"" if self.hold_done else DONE_FRAME
        if self.timeline is not None:
            done = b": server-timing " + self.timeline.server_timing(timing, time.monotonic()).encode() + b"\n\n" + done
        if self._usage_comment and usage is not None:
            return usage_comment(usage) + done
        return done

    closing = DONE_FRAME        # what ends a stream after an error frame (ResponseEventEncoder: nothing)

    def held_done(self) -> bytes:
        """What `done` held back (`hold_done`), sent by the writer once the ledger has the row."""
        return DONE_FRAME

    def error(self, err: ApiError, usage: Usage | None) -> bytes:
        body = self._ident.header(self._object)
        body["choices"] = []
        body["error"] = err.body()
        if usage is not None and self._include_usage:
            body["usage"] = usage_dict(usage)
        return b"data: " + orjson.dumps(body) + b"\n\n"


USAGE_COMMENT = b": inferd-usage "


def usage_comment(usage: Usage) -> bytes:
    return USAGE_COMMENT + b"%d %d\n\n" % (usage.prompt_tokens, usage.completion_tokens)
