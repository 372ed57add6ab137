"""vLLM's tokenizer routes, request side: the bodies of POST /tokenize and POST /detokenize.

vLLM (vllm/entrypoints/serve/tokenize/protocol.py) takes two /tokenize bodies, a prompt and a chat; one
struct here takes either, and `prepare_tokenize` refuses what vLLM would quietly ignore (a chat option
beside a `prompt`, both forms at once). `model` is optional there and here: lm-evaluation-harness's
remote tokenizer sends none. Defaults as vLLM's: `add_special_tokens` true for a prompt and false for
messages (the chat template writes the special tokens), `add_generation_prompt` true.
"""
from __future__ import annotations

from typing import Annotated

import msgspec

from inferd.api.errors import invalid
from inferd.api.wire.openai import MAX_MESSAGES, ChatCompletionRequest, ChatMessage, decode_with, prepare

TokenId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]     # vLLM's bounds; the vocabulary is checked later
# The fields only a chat body may carry.
CHAT_ONLY = ("add_generation_prompt", "continue_final_message")


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """POST /tokenize: `prompt` (a string) or `messages` (chat, rendered with the model's template)."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    # vLLM's "leave the last message open": not implemented, so accepted only as false
    continue_final_message: bool | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """POST /detokenize: token ids -> text."""

    tokens: list[TokenId]
    model: str | None = None


class TokenizeInput(msgspec.Struct, kw_only=True):
    """A checked /tokenize body: what the handler needs."""

    model: str | None
    prompt: str | None                      # a prompt body
    messages: list[dict] | None             # a chat body, as the chat route hands them to the template
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool


_tokenize = msgspec.json.Decoder(TokenizeRequest)
_detokenize = msgspec.json.Decoder(DetokenizeRequest)


def decode_tokenize(body: bytes) -> TokenizeInput:
    """Bytes -> a checked /tokenize body, or a 400 whose message and `param` name the field."""
    return prepare_tokenize(decode_with(_tokenize, body))


def decode_detokenize(body: bytes) -> DetokenizeRequest:
    return decode_with(_detokenize, body)


def prepare_tokenize(req: TokenizeRequest) -> TokenizeInput:
    if req.prompt is None and req.messages is None:
        raise invalid("Missing required parameter: prompt (a string) or messages (a chat).", param="prompt",
                      code="missing_required_parameter")
    if req.prompt is not None and req.messages is not None:
        raise invalid("messages: send either `prompt` or `messages`, not both.", param="messages",
                      code="invalid_value")
    if req.continue_final_message:
        raise invalid("continue_final_message: not supported by this server; only false is accepted.",
                      param="continue_final_message", code="unsupported_parameter")
    if req.prompt is not None:
        for name in CHAT_ONLY:
            if getattr(req, name) is not None:
                raise invalid(f"{name}: only with `messages`; a `prompt` is tokenized as it is.", param=name,
                              code="invalid_value")
        return TokenizeInput(model=req.model, prompt=req.prompt, messages=None,
                             add_special_tokens=req.add_special_tokens is not False, add_generation_prompt=False,
                             return_token_strs=bool(req.return_token_strs))
    # The chat route's own checks and conversion, so /tokenize renders exactly what /v1/chat/completions would.
    chat = prepare("chat", ChatCompletionRequest(model=req.model or "", messages=req.messages))
    return TokenizeInput(model=req.model, prompt=None, messages=chat.messages,
                         add_special_tokens=bool(req.add_special_tokens),
                         add_generation_prompt=req.add_generation_prompt is not False,
                         return_token_strs=bool(req.return_token_strs))
