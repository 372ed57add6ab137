"""What differs between the endpoints that share the pipeline, in one table: what each calls its prompt and
its output cap (error messages name the client's own field), its response ids, the ledger's name for it,
its default output length, and whether a peer may serve it.

The pipeline reads these fields instead of testing which endpoint it runs, so a new endpoint is a row here
and a stage list in inferd.api.pipeline.run.
"""
from __future__ import annotations

from dataclasses import dataclass

COMPLETIONS_DEFAULT_MAX_TOKENS = 16   # OpenAI's default for /v1/completions; chat defaults to the context


@dataclass(frozen=True, slots=True)
class Endpoint:
    kind: str                       # RequestContext.kind / Prepared.kind
    prompt_field: str               # what the client called the prompt
    max_tokens_field: str           # ... and the output cap
    id_prefix: str                  # of the response's id
    ledger_name: str                # the ledger's `endpoint` column
    default_max_tokens: int | None  # when the client set none (None: the rest of the context)
    spillable: bool                 # a peer may serve it (not what needs this node's store)
    generates: bool = True          # it streams generated tokens (a first token, decode timings)


ENDPOINTS = {e.kind: e for e in (
    Endpoint("completion", "prompt", "max_tokens", "cmpl-", "completions", COMPLETIONS_DEFAULT_MAX_TOKENS, True),
    Endpoint("chat", "messages", "max_completion_tokens", "chatcmpl-", "chat.completions", None, True),
    # its previous_response_id and `store` live in this node's store
    Endpoint("responses", "input", "max_output_tokens", "resp_", "responses", None, False),
    Endpoint("embedding", "input", "", "", "embeddings", None, False, generates=False),
)}
