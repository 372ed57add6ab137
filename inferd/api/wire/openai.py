"""OpenAI wire format, request side: the request structs, decoding, and validation.

The structs are the single source of truth for what the server accepts: the decoder uses them
(unknown fields are errors) and /openapi.json is generated from them.

Team rule for OpenAI parameters we do not implement: they are accepted at their no-op value
(`NO_OP_VALUES`) and rejected with a 400 naming them otherwise; we never silently ignore a value
that would change the output.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

import msgspec

from inferd.api.errors import ApiError, invalid
from inferd.api.wire.json_depth import depth_exceeds, too_deep_message
from inferd.api.wire.strict import STRICT, is_no_op, show_value
from inferd.api.wire.sampling import MinP, Penalty, RepetitionPenalty, TopK, parse_logit_bias
from inferd.api.wire.structured import ResponseFormat, StructuredOutputs, guided_for, legacy_hint, set_guided
from inferd.api.wire.tools import MessageToolCall, Tool, ToolChoice, prepare_tools, tool_message_fields
from inferd.types import GuidedDecoding

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
StopList = Annotated[list[str], msgspec.Meta(max_length=4)]
# Each message costs templating and tokens even when empty; tens of thousands would make one
# request's preparation take seconds. A longer conversation is a 400 naming `messages`.
MAX_MESSAGES = 2048
MAX_METADATA_KEYS = 16      # as OpenAI's `metadata`: 16 pairs, keys up to 64 characters, values up to 512
MetadataMap = Annotated[dict[Annotated[str, msgspec.Meta(max_length=64)], Annotated[str, msgspec.Meta(max_length=512)]],
                        msgspec.Meta(max_length=MAX_METADATA_KEYS)]
# Holding back text that could start a stop string costs in proportion to its length, per token.
MAX_STOP_CHARS = 256
# A list of prompts in /v1/completions becomes one engine request per prompt (LangChain sends up to 20).
MAX_PROMPTS = 64
# `n`: choices per prompt, each its own engine request; `[server] max_n` may lower this cap, never raise it.
MAX_N = 16
ChoiceCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_N)]
# Log-probability alternatives per token, as OpenAI bounds them: chat's top_logprobs 0..20, completions' logprobs 0..5.
TopLogprobs = Annotated[int, msgspec.Meta(ge=0, le=20)]
CompletionLogprobs = Annotated[int, msgspec.Meta(ge=0, le=5)]
Prompt = Union[str, list[Union[str, int, list[int]]]]



class StreamOptions(msgspec.Struct, **STRICT):
    include_usage: bool | None = None
    # vLLM's extension (guidellm sends it): usage so far on every chunk
    continuous_usage_stats: bool | None = None
    include_obfuscation: bool | None = None     # no-op value: false (we never add padding fields)


class ContentPart(msgspec.Struct, **STRICT):
    """A part of a chat message's content; only `type: "text"` is supported."""

    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


OTHER_PART_FIELDS = ("image_url", "input_audio", "file", "refusal")
# Decoded (OpenAI clients send them) but refused by `prepare`: the legacy function-calling messages, audio
# and refusals. /openapi.json leaves these roles out and allows these message fields only at null.
UNSUPPORTED_ROLES = ("function",)
UNSUPPORTED_MESSAGE_FIELDS = ("function_call", "audio", "refusal")


class ChatMessage(msgspec.Struct, **STRICT):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None     # assistant: the calls it made (inferd.api.wire.tools)
    tool_call_id: str | None = None                     # tool: the call this answers
    function_call: Any = None
    refusal: str | None = None
    audio: Any = None


class _SamplingFields(msgspec.Struct, **STRICT):
    model: str
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: str | StopList | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    # inferd: seconds the client will wait; caps the request's deadline (as the X-Request-Timeout header)
    timeout: Annotated[float, msgspec.Meta(gt=0.0)] | None = None
    # inferd (as vLLM): generate past end-of-sequence up to max_tokens; for benchmarks
    ignore_eos: bool | None = None
    # inferd: false turns a model's speculative decoding off for this request (docs/speculative.md)
    speculative: bool | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # token id (a string) -> bias in [-100, 100]: checked by wire.sampling.parse_logit_bias; the ids against
    # the model's vocabulary once it is known (pipeline.sampling.check_logit_bias)
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions (docs/api.md)
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    n: ChoiceCount | None = None            # choices per prompt (see Prepared.choice_seed)
    # the output's grammar (inferd.api.wire.structured): OpenAI's (vLLM takes it on completions too), vLLM's
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None


class CompletionRequest(_SamplingFields, **STRICT):
    """POST /v1/completions"""

    prompt: Prompt
    best_of: int | None = None
    echo: bool | None = None                    # the prompt's text (with logprobs, its tokens') before the output
    logprobs: CompletionLogprobs | None = None
    suffix: str | None = None


class ChatCompletionRequest(_SamplingFields, **STRICT):
    """POST /v1/chat/completions"""

    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    moderation: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None
    service_tier: str | None = None
    store: bool | None = None
    metadata: MetadataMap | None = None             # annotation only: never changes the output
    prompt_cache_key: str | None = None             # a routing hint; our prefix cache is automatic
    prompt_cache_retention: str | None = None
    prompt_cache_options: Any = None
    safety_identifier: str | None = None


# field -> (values that leave the output unchanged, how to say it). None always counts as absent.
NO_OP_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    "best_of": ((1,), "1"),
    "suffix": (("",), "null or \"\""),
    "functions": (([],), "null or []"),
    "function_call": (("none",), "null or \"none\""),
    "audio": ((), "null"),
    "modalities": ((["text"],), "null or [\"text\"]"),
    "prediction": ((), "null"),
    "moderation": ((), "null"),
    "reasoning_effort": ((), "null"),
    "verbosity": ((), "null"),
    "web_search_options": ((), "null"),
    "service_tier": (("auto", "default"), "null, \"auto\" or \"default\""),
    "store": ((False,), "null or false"),
    "prompt_cache_retention": (("in_memory",), "null or \"in_memory\""),
    "prompt_cache_options": ((), "null"),
}

_decoders = {
    "completion": msgspec.json.Decoder(CompletionRequest),
    "chat": msgspec.json.Decoder(ChatCompletionRequest),
}
_PATH = re.compile(r" - at `\$\.?(.*)`$")
_KEY_PATH = re.compile(r" - at `key` in `\$\.?(.*)`$")     # a map's key broke its rule: the map is the field
_FIELD = re.compile(r"field `([^`]*)`")


def decode(kind: str, body: bytes) -> CompletionRequest | ChatCompletionRequest:
    """Bytes -> typed request, or a 400 whose message and `param` name the offending field."""
    return decode_with(_decoders[kind], body)


def decode_with(decoder: msgspec.json.Decoder, body: bytes) -> Any:
    """`decode` with any request struct's decoder (the embeddings route's, say)."""
    if not body:
        raise invalid("Request body is empty; expected a JSON object.", code="invalid_json")
    if depth_exceeds(body):         # before any field is typed: nothing after the decoder walks a deeper value
        raise invalid(too_deep_message(), code="invalid_json")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise invalid(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    except UnicodeDecodeError:
        raise invalid("Request body is not valid UTF-8.", code="invalid_encoding") from None
    except RecursionError:          # only malformed text can get past depth_exceeds this deep
        raise invalid(too_deep_message(), code="invalid_json") from None


def _validation_error(text: str) -> ApiError:
    key = _KEY_PATH.search(text)
    m = key or _PATH.search(text)
    # `metadata[...]` is msgspec's name for any one value of the map `metadata`: the field is the map
    where = m.group(1).replace("[...]", "") if m else ""
    detail = text[: m.start()] if m else text
    field = _FIELD.search(detail)
    if detail.startswith("Object contains unknown field"):
        param = _join(where, field.group(1) if field else "")
        return ApiError(400, f"Unrecognized request argument supplied: {param}{legacy_hint(param)}", param=param,
                        code="unknown_parameter")
    if detail.startswith("Object missing required field"):
        param = _join(where, field.group(1) if field else "")
        return ApiError(400, f"Missing required parameter: {param}", param=param, code="missing_required_parameter")
    detail = detail.replace("`", "")
    detail = ("a key: " if key else "") + detail[:1].lower() + detail[1:]
    if not where:
        return invalid(f"Invalid request body: {detail}", code="invalid_type")
    return invalid(f"{where}: {detail}", param=where, code="invalid_value")


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where and name else (where or name)


class Prepared(msgspec.Struct, kw_only=True):
    """What a handler needs after validation, before tokenization."""

    kind: str                               # "completion" | "chat"
    prompt_text: str | None = None          # completions with a text prompt
    prompt_token_ids: list[int] | None = None
    batch: list[str | list[int]] | None = None  # completions with a list of 2+ prompts: one choice each
    messages: list[dict] | None = None      # chat: for the model's chat template
    prompt_chars: int = 0                   # how much text tokenization will see
    max_tokens: int | None = None           # None: the chat default (up to the context)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False          # usage so far on every chunk (stream_options.continuous_usage_stats)
    ignore_eos: bool = False
    speculative: bool = True                # false: one token a step, whatever the model's [speculative] says
    timeout: float | None = None            # the body's `timeout` (seconds), if any
    top_k: int = 0                          # 0: no top-k filter (the wire's -1 too)
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias), by token id
    n: int = 1                              # choices per prompt
    logprobs: int | None = None             # log-probabilities with this many alternatives per token (None: none)
    echo: bool = False                      # completions: the prompt before the output (and its logprobs)
    guided: GuidedDecoding | None = None    # the grammar the output follows (response_format, tools, vLLM's fields)
    guided_param: str | None = None         # the request field that asked for it: errors name it
    tools: list[dict] | None = None         # chat: the function tools, as the chat template takes them
    tool_choice: str = "none"               # "none" | "auto" | "required" | "function" (tool_name's)
    tool_name: str | None = None            # tool_choice naming one function
    parallel_tool_calls: bool = True

    def choice_seed(self, j: int) -> int | None:
        """The seed of a prompt's choice `j`: the request's seed + j (modulo 2**64, kept signed), so a
        seeded request gives the same n choices whatever is batched with it, and choice 0 is what the
        same request with n=1 gives."""
        if self.seed is None:
            return None
        return (self.seed + j + 2**63) % 2**64 - 2**63

    def prompts(self) -> list[Prepared]:
        """One Prepared per prompt of a completions batch (just this one when it is not a batch)."""
        if self.batch is None:
            return [self]
        return [msgspec.structs.replace(self, batch=None, prompt_chars=len(x) if isinstance(x, str) else 0,
                                        prompt_text=x if isinstance(x, str) else None,
                                        prompt_token_ids=None if isinstance(x, str) else x)
                for x in self.batch]


def prepare(kind: str, req: CompletionRequest | ChatCompletionRequest) -> Prepared:
    """Check the semantic rules msgspec cannot express; raise a 400 naming the field."""
    for name, (allowed, say) in NO_OP_VALUES.items():
        value = getattr(req, name, None)
        if not is_no_op(value, allowed):
            raise invalid(f"{name}: not supported by this server; only {say} is accepted (got {show_value(value)}).",
                          param=name, code="unsupported_parameter")
    opts = req.stream_options
    if opts is not None and not req.stream:
        # As OpenAI: options for a stream that is not one would be silently ignored.
        raise invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                      param="stream_options", code="invalid_value")
    if opts is not None and opts.include_obfuscation:
        raise invalid("stream_options.include_obfuscation: only false is accepted.",
                      param="stream_options.include_obfuscation", code="unsupported_parameter")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    for i, s in enumerate(stop):
        if not s:
            raise invalid(f"stop[{i}]: stop strings must be non-empty.", param="stop")
        if len(s) > MAX_STOP_CHARS:
            raise invalid(f"stop[{i}]: stop strings are at most {MAX_STOP_CHARS} characters, got {len(s)}.",
                          param="stop", code="invalid_value")
    out = Prepared(kind=kind, max_tokens=req.max_tokens, stop=stop, seed=req.seed, stream=bool(req.stream),
                   include_usage=bool(opts and opts.include_usage),
                   continuous_usage=bool(opts and opts.continuous_usage_stats), ignore_eos=bool(req.ignore_eos),
                   speculative=req.speculative is not False,
                   temperature=1.0 if req.temperature is None else req.temperature,
                   top_p=1.0 if req.top_p is None else req.top_p, timeout=req.timeout,
                   top_k=max(req.top_k or 0, 0), min_p=req.min_p or 0.0,
                   presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0,
                   repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                   logit_bias=parse_logit_bias(req.logit_bias), n=req.n or 1)
    _prepare_logprobs(kind, req, out)
    guided = guided_for(req.response_format, req.structured_outputs)
    if guided is not None:
        set_guided(out, *guided)
    if kind == "completion":
        _prepare_prompt(req.prompt, out)
    else:
        _prepare_messages(req, out)
    return out


def _prepare_logprobs(kind: str, req: CompletionRequest | ChatCompletionRequest, out: Prepared) -> None:
    """Chat: `logprobs: true` and top_logprobs alternatives; completions: `logprobs: k` alternatives, and `echo`."""
    if kind == "completion":
        out.logprobs, out.echo = req.logprobs, bool(req.echo)
        return
    if req.top_logprobs is not None and req.logprobs is not True:
        # As OpenAI's API: alternatives without the tokens' own log-probabilities are a request error.
        raise invalid("top_logprobs: requires logprobs to be true.", param="top_logprobs", code="invalid_value")
    if req.logprobs:
        out.logprobs = req.top_logprobs or 0


def _prepare_prompt(prompt: Any, out: Prepared) -> None:
    """A string, a list of token ids, or a list of either (one choice per prompt, as OpenAI's API)."""
    if isinstance(prompt, list):
        if not prompt:
            raise invalid("prompt: must not be empty.", param="prompt", code="empty_prompt")
        if all(type(t) is int for t in prompt):
            out.prompt_token_ids = prompt
            return
        if not (all(isinstance(x, str) for x in prompt) or all(isinstance(x, list) for x in prompt)):
            raise invalid("prompt: a list must hold token ids, strings, or token-id lists, not a mix.",
                          param="prompt", code="invalid_prompt")
        if len(prompt) > MAX_PROMPTS:
            raise invalid(f"prompt: at most {MAX_PROMPTS} prompts per request, got {len(prompt)}.",
                          param="prompt", code="too_many_prompts")
        for i, x in enumerate(prompt):
            if not x:
                raise invalid(f"prompt[{i}]: must not be empty.", param="prompt", code="empty_prompt")
        if len(prompt) > 1:
            out.batch = prompt
            out.prompt_chars = sum(len(x) for x in prompt if isinstance(x, str))
            return
        prompt = prompt[0]
        if isinstance(prompt, list):
            out.prompt_token_ids = prompt
            return
    if not isinstance(prompt, str) or not prompt:
        raise invalid("prompt: must be a non-empty string or a list of token ids.", param="prompt",
                      code="empty_prompt")
    out.prompt_text = prompt
    out.prompt_chars = len(prompt)


def _prepare_messages(req: ChatCompletionRequest, out: Prepared) -> None:
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise invalid("max_tokens and max_completion_tokens disagree; send one of them.",
                      param="max_completion_tokens")
    out.max_tokens = req.max_completion_tokens or req.max_tokens
    messages: list[dict] = []
    chars = 0
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if m.role in UNSUPPORTED_ROLES:
            raise invalid(f"{where}.role: function messages (the legacy function calling) are not supported; "
                          "use tool messages.",
                          param=f"{where}.role", code="unsupported_parameter")
        for name in UNSUPPORTED_MESSAGE_FIELDS:
            if getattr(m, name) not in (None, []):
                raise invalid(f"{where}.{name}: not supported by this server; only null is accepted.",
                              param=f"{where}.{name}", code="unsupported_parameter")
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise invalid(f"{where}.content[{j}]: only text parts (type \"text\" with a `text` string) "
                                  f"are supported, got type {part.type!r}.", param=f"{where}.content[{j}]",
                                  code="unsupported_parameter")
                for name in OTHER_PART_FIELDS:     # a text part carries text only; never drop the rest
                    if getattr(part, name) is not None:
                        raise invalid(f"{where}.content[{j}].{name}: not allowed in a \"text\" part.",
                                      param=f"{where}.content[{j}].{name}", code="unsupported_parameter")
                texts.append(part.text)
            content = "\n".join(texts)
        elif content is None:
            if m.role != "assistant":
                raise invalid(f"{where}.content: required for role {m.role!r}.", param=f"{where}.content")
            content = ""
        chars += len(content)
        # HF chat templates know system/user/assistant; "developer" is OpenAI's newer name for system.
        msg = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        tool_message_fields(m, where, msg)
        messages.append(msg)
    out.messages = messages
    out.prompt_chars = chars
    prepare_tools(req, out)
