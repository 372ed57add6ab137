"""How deep a JSON body nests, checked before it is decoded: a bound every request body and batch line obeys.

A decoder into a free-form field (a JSON schema, a tool's parameters, `metadata`) recurses once per level,
and so does every later walk of the value (the grammar compiler, a chat template's `tojson`): a body nested
100,000 deep would end in a RecursionError somewhere, a 500 with a traceback. Refusing it at the door, before
any field is typed, keeps every later step within a bound it can rely on. 128 levels is far past any real
JSON schema or tool definition (OpenAI's Structured Outputs allow 10 levels of object nesting).

The check is vectorized, never a Python loop over the bytes: a body with few brackets cannot nest deeply
(bytes.count), so most bodies cost two scans; otherwise the strings (whose brackets do not nest) are cut
out with bytes.translate/replace/split (see _skeleton), and the depth is the running sum's maximum (numpy).
"""
from __future__ import annotations

import numpy as np

MAX_DEPTH = 128

_NOT_SYNTAX = bytes(b for b in range(256) if b not in b'[]{}"')       # all but brackets and quotes
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")       # an opener +1, a closer -1 (as int8)


def _openers(data: bytes) -> int:
    return data.count(b"[") + data.count(b"{")


def _skeleton(data: bytes) -> bytes:
    """The brackets of `data` outside its strings. Backslashes occur only in strings: dropping `\\\\` pairs
    left to right (as a JSON reader pairs them), then `\\"`, leaves quotes that only open or close a string.
    Of those, two side by side enclose no bracket (an empty string, or the end of one and the start of the
    next): dropping them keeps the others paired. Every other piece between the rest is outside a string."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = data.translate(None, _NOT_SYNTAX).replace(b'""', b"")
    return b"".join(kept.split(b'"')[::2]) if b'"' in kept else kept


def depth_exceeds(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text `data` nests arrays/objects more than `limit` levels deep. For text that
    is not valid JSON the answer is a guess (an unterminated string's brackets count); the decoder then
    refuses it anyway."""
    if _openers(data) <= limit:
        return False
    skeleton = _skeleton(data)
    if _openers(skeleton) <= limit:
        return False
    if not skeleton[:limit + 1].strip(b"[{"):     # opens deeper than the bound at once: the usual attack
        return True
    depth = np.cumsum(np.frombuffer(skeleton.translate(_STEPS), dtype=np.int8), dtype=np.int32)
    return int(depth.max()) > limit


def too_deep_message(what: str = "Request body") -> str:
    return f"{what} is nested deeper than {MAX_DEPTH} levels (arrays and objects); at most {MAX_DEPTH} are allowed."
