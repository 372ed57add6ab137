"""What a request's ledger row bills: what its client received, not what the engine generated.

The rule (docs/store.md has it as a table):
- answered (a status below 400) with the engine's usage: that usage, as the response reports it;
- a JSON response that ended in an error (504 past its deadline, 503 aborted at drain, 499 the client
  left): 0 tokens, prompt included, since the client got nothing it can use (OpenAI does not bill a
  request that failed);
- a stream that did not complete: the output tokens in the frames its client's socket took
  (inferd.api.streaming.accepted), and its prompt when at least one of them reached it;
- refused or abandoned before it ran (499 while queued, 429, 504 in the queue): 0 tokens.
"""
from __future__ import annotations

from inferd.api.pipeline.context import RequestContext
from inferd.types import Delta, Usage

NOTHING = Usage(prompt_tokens=0, completion_tokens=0)


def billed_usage(ctx: RequestContext, status: int, last: Delta | None, delivered: int) -> Usage:
    """The usage `ctx`'s row records, having ended with `status`: `delivered` is the output tokens its
    client received (a stream's socket-accepted tokens)."""
    usage = last.usage if last is not None else None
    if status < 400 and usage is not None:
        return usage
    if status >= 400 and not getattr(ctx.prepared, "stream", False):
        return NOTHING
    if not delivered:
        return NOTHING
    cached = usage.cached_tokens if usage is not None else 0
    return Usage(prompt_tokens=ctx.prompt_tokens, completion_tokens=delivered, cached_tokens=cached)
