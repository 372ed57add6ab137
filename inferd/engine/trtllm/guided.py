"""Structured output on TensorRT-LLM: a GuidedDecoding as its GuidedDecodingParams (docs/trtllm-api.md §3b).

TensorRT-LLM masks the logits itself, with xgrammar in its C++ executor (batch_manager/guidedDecoder.cpp),
once the LLM is built with guided_decoding_backend="xgrammar". What inferd adds:
- the same kinds as the other backends: json_object is sent as the JSON schema {"type":"object"} (its own
  json_object is any JSON value, xgrammar's builtin JSON grammar); a choice is sent as the regex of its
  escaped alternatives; a json_schema, regex or EBNF grammar as itself;
- a grammar reaches the executor only once our own xgrammar compiled it (engine.grammars, the API's
  grammar stage): the executor compiles a request's grammar inside its step, where a refusal is not one
  request's 400;
- a request with a grammar is never sent with ignore_eos: the grammar ends by allowing only the end token,
  which must end the request (as on the other backends, where the grammar's end is a stop).
"""
from __future__ import annotations

from typing import Any

from inferd.engine.base import InvalidRequest
from inferd.engine.grammar import JSON_OBJECT_SCHEMA, Grammars, choice_regex
from inferd.types import GuidedDecoding


def check_compiled(grammars: Grammars, guided: GuidedDecoding) -> None:
    """InvalidRequest unless `guided` compiled with our xgrammar (the API compiles it before submit)."""
    verdict = grammars.verdict(guided)
    if verdict is None:
        raise InvalidRequest("the grammar was not compiled before submit (Engine.grammars.compile, off the loop)")
    if verdict:
        raise InvalidRequest(verdict)


def guided_decoding_params(guided: GuidedDecoding, params_class: Any) -> Any:
    """TensorRT-LLM's GuidedDecodingParams (`params_class`) for `guided`."""
    kind, spec = guided.kind, guided.spec
    if kind == "json_schema":
        return params_class(json=spec)
    if kind == "json_object":
        return params_class(json=JSON_OBJECT_SCHEMA)
    if kind == "regex":
        return params_class(regex=spec)
    if kind == "choice":
        return params_class(regex=choice_regex(spec))
    return params_class(grammar=spec)
