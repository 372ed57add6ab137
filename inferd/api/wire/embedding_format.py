"""OpenAI wire format of POST /v1/embeddings: the request struct, its inputs, and the response body.

`input` is a string, a list of strings, a list of token ids, or a list of token-id lists (the
official SDK sends strings; tiktoken-minded clients send ids). `encoding_format` is "float" or
"base64": base64 of little-endian float32, which the official Python SDK asks for by default and
decodes itself. `dimensions` truncates a Matryoshka model's vectors and renormalizes them.
"""
from __future__ import annotations

import base64
from typing import Annotated, Literal, Union

import msgspec
import numpy as np
import orjson

from inferd.api.errors import invalid
from inferd.api.wire.openai import Prepared, decode_with

# OpenAI's limit on inputs per request. Admission sees each input as a request, but one HTTP request
# keeps at most a batch's worth of them in the queue at a time (inferd.api.pipeline.embedding_admission), so a long
# list cannot fill the node's queue.
MAX_INPUTS = 2048
Input = Union[str, list[Union[str, int, list[int]]]]


class EmbeddingRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/embeddings"""

    model: str
    input: Input
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None


_decoder = msgspec.json.Decoder(EmbeddingRequest)


def decode(body: bytes) -> EmbeddingRequest:
    """Bytes -> typed request, or a 400 whose message and `param` name the offending field."""
    return decode_with(_decoder, body)


def inputs(req: EmbeddingRequest) -> list[str | list[int]]:
    """The request's inputs, one per vector, each a string or token ids; 400 naming the bad one."""
    raw = req.input
    if isinstance(raw, str):
        items: list = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        items = [list(raw)]                   # one input given as token ids
    else:
        items = list(raw)
        if any(isinstance(x, int) for x in items):
            raise invalid("input: mixes token ids with strings or lists; send a list of strings, a list of token "
                          "ids, or a list of token-id lists.", param="input", code="invalid_value")
    if not items:
        raise invalid("input: must not be empty.", param="input", code="invalid_value")
    if len(items) > MAX_INPUTS:
        raise invalid(f"input: {len(items)} inputs; at most {MAX_INPUTS} per request.", param="input",
                      code="invalid_value")
    for i, x in enumerate(items):
        if len(x) == 0:
            what = "an empty string" if isinstance(x, str) else "an empty list of token ids"
            raise invalid(f"input[{i}]: {what}; every input must have content.", param=f"input[{i}]",
                          code="invalid_value")
    return items


def prepared(items: list[str | list[int]]) -> Prepared:
    """The inputs as the content policies read prompts (inferd.api.pipeline.safety)."""
    return Prepared(kind="embedding", batch=items, prompt_chars=sum(len(x) for x in items if isinstance(x, str)))


def check_dimensions(dimensions: int | None, native: int, minimum: int | None, model: str) -> int:
    """The width to return: `dimensions` where the model allows truncation, else its native width."""
    if dimensions is None or dimensions == native:
        return native
    if minimum is None:
        raise invalid(f"dimensions: `{model}` does not support truncating its {native}-dimensional vectors.",
                      param="dimensions", code="invalid_value")
    if not minimum <= dimensions <= native:
        raise invalid(f"dimensions: must be between {minimum} and {native} for `{model}`, got {dimensions}.",
                      param="dimensions", code="invalid_value")
    return dimensions


def truncate(vector: np.ndarray, dimensions: int) -> np.ndarray:
    """The first `dimensions` components, renormalized to unit length (Matryoshka truncation)."""
    if dimensions >= vector.shape[0]:
        return vector
    head = vector[:dimensions].astype(np.float32)
    norm = float(np.linalg.norm(head))
    return head / np.float32(norm) if norm > 0 else head


def response_body(vectors: list[np.ndarray], model: str, prompt_tokens: int, encoding: str) -> bytes:
    if encoding == "base64":
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")}
                for i, v in enumerate(vectors)]
    else:
        data = [{"object": "embedding", "index": i, "embedding": np.asarray(v, dtype=np.float32)}
                for i, v in enumerate(vectors)]
    return orjson.dumps({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}},
                        option=orjson.OPT_SERIALIZE_NUMPY)
