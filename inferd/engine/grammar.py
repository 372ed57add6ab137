"""Grammars: compile a GuidedDecoding with xgrammar, once per (tokenizer, grammar), and mask logits by it.

- `Grammars` holds one tokenizer's compiled grammars in a bounded LRU cache keyed by the GuidedDecoding
  (the API sends a schema as compact JSON in the client's key order). `compile()` blocks (a small
  JSON schema takes milliseconds, an EBNF grammar over a 128k vocabulary much longer): callers run it off
  the event loop. Refusals are cached too, so a client repeating a bad schema costs one compile.
- `GrammarState` is one sequence's matcher: `mask(row)` sets the logits of tokens the grammar does not
  allow next to -inf, `accept(token)` advances it, `terminated` says the grammar has ended (it accepted a
  stop token after a complete output).

xgrammar imports torch (~2 s): it is imported on first use, on whichever thread compiles first, never
at module import. Output is compact JSON (any_whitespace=False), so a model cannot pad with whitespace
forever; json_schema uses xgrammar's strict mode (no properties or items the schema does not name),
which is a subset of what the schema accepts, so the output always validates.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from inferd.engine.schema_check import unenforced
from inferd.types import GuidedDecoding

if TYPE_CHECKING:
    from inferd.engine.tokenization import HFTokenizer

__all__ = ["DEAD_END", "GrammarError", "GrammarState", "GrammarUnavailable", "Grammars", "MAX_SPEC_BYTES"]

# A sequence's end (FinishReason.ERROR with this error) when its grammar allows no token at all: the client's
# grammar asked for text no token can write (a JSON schema `pattern` requiring a raw control character, which
# JSON strings cannot hold and the mask bans). The client's doing, not the engine's: the API answers 400 and
# the version's breaker and rollouts do not count it (inferd.api.wire.responses, pipeline.versioned).
DEAD_END = "the output reached a point where its grammar allows no token"

MAX_SPEC_BYTES = 64 * 1024          # a schema, regex or grammar longer than this is refused before compiling
MAX_ENTRIES = 256                   # compiled grammars (and refusals) kept per tokenizer
MAX_CACHE_BYTES = 512 * 1024 * 1024  # and their memory: a grammar over a 128k vocabulary can take megabytes
MAX_VERDICTS = 16384                # whether a grammar compiled, remembered per digest (see Grammars.verdict)
JSON_OBJECT_SCHEMA = '{"type":"object"}'  # OpenAI's json_object: any object (not any JSON value)
# xgrammar's messages start with its log prefix: "[01:16:47] /project/cpp/json_schema_converter.cc:4944: "
_LOG_PREFIX = re.compile(r"^\s*\[[0-9:]+\]\s+\S+:\d+:\s*")
_REGEX_SPECIAL = frozenset("\\^$.|?*+()[]{}/-")


class GrammarError(ValueError):
    """xgrammar refused the grammar, or it is over a size bound; the message says why (no field name:
    the API adds the request field that asked for the grammar)."""


class GrammarUnavailable(GrammarError):
    """xgrammar is not installed (pip install 'inferd[structured]')."""


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:   # an optional dependency: this daemon serves no structured output
        raise GrammarUnavailable("structured output needs xgrammar, which is not installed") from exc
    return xgrammar


def _clean(exc: BaseException) -> str:
    """xgrammar's message without its log prefix and C++ source location, on one line."""
    lines = [_LOG_PREFIX.sub("", line).strip() for line in str(exc).splitlines()]
    text = " ".join(line for line in lines if line)
    return text[:500] or type(exc).__name__


def _digest(guided: GuidedDecoding) -> bytes:
    return hashlib.blake2b(f"{guided.kind}\0{guided.spec}".encode(), digest_size=16).digest()


def choice_regex(spec: str) -> str:
    """The regex matching exactly one of a JSON list of strings (vLLM's guided_choice)."""
    try:
        choices = json.loads(spec)
    except ValueError:
        raise GrammarError("choice must be a JSON list of strings") from None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise GrammarError("choice must be a non-empty list of strings")
    escaped = ("".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in c) for c in choices)
    return "(" + "|".join(escaped) + ")"


def _hf_info(xgr: Any, tokenizer: HFTokenizer, vocab_size: int, stop_ids: Sequence[int]) -> Any:
    """TokenizerInfo of a Hugging Face fast tokenizer, as xgrammar's own from_huggingface builds it."""
    rust = tokenizer.backend_tokenizer
    vocab = rust.get_vocab(with_added_tokens=True)
    encoded = [""] * max(max(vocab.values(), default=-1) + 1, 0)
    for token, tid in vocab.items():
        encoded[tid] = token
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(rust.to_str())
    return xgr.TokenizerInfo(encoded, vocab_type=meta["vocab_type"], vocab_size=max(vocab_size, len(encoded)),
                             stop_token_ids=list(stop_ids), add_prefix_space=meta["add_prefix_space"])


class Grammars:
    """One tokenizer's compiled grammars (thread-safe; a bounded LRU cache keyed by GuidedDecoding).

    `vocab_size` is the width of the logits rows `GrammarState.mask` is given (a model may pad its
    vocabulary beyond the tokenizer's); ids the tokenizer lacks are never allowed.
    """

    def __init__(self, make_info: Callable[[Any], Any], vocab_size: int, *, max_entries: int = MAX_ENTRIES,
                 max_bytes: int = MAX_CACHE_BYTES) -> None:
        self._make_info = make_info
        self.vocab_size = vocab_size
        self._max_entries, self._max_bytes = max_entries, max_bytes
        self._lock = threading.Lock()
        self._init_lock = threading.Lock()
        self._compiler: Any = None
        self._json_keep: np.ndarray | None = None     # tokens JSON may hold: all but control characters (_control_tokens)
        self._cache: OrderedDict[GuidedDecoding, tuple[Any, int]] = OrderedDict()   # value: (grammar | error, bytes)
        self._bytes = 0
        self._verdicts: OrderedDict[bytes, str] = OrderedDict()    # digest -> "" (compiled) or the refusal
        # grammar -> the compile running for it: a second caller waits for it rather than compiling again
        self._flights: dict[GuidedDecoding, Future] = {}
        self.compiles = 0            # compiles done (a cached grammar, or a cached refusal, compiles nothing)

    @classmethod
    def for_hf(cls, tokenizer: HFTokenizer, vocab_size: int | None = None, **bounds: int) -> Grammars:
        """For a Hugging Face tokenizer; `vocab_size`: the model's logits width (default: the tokenizer's)."""
        size = max(vocab_size or 0, tokenizer.vocab_size)
        stops = tuple(tokenizer.eos_token_ids)
        return cls(lambda xgr: _hf_info(xgr, tokenizer, size, stops), size, **bounds)

    @classmethod
    def for_pieces(cls, pieces: Sequence[bytes], stop_token_ids: Sequence[int], vocab_size: int,
                   **bounds: int) -> Grammars:
        """For a vocabulary given as each id's bytes (b"" for special tokens), e.g. the sim's."""
        stops = list(stop_token_ids)
        return cls(lambda xgr: xgr.TokenizerInfo(list(pieces), xgr.VocabType.RAW, vocab_size=vocab_size,
                                                 stop_token_ids=stops), vocab_size, **bounds)

    def _get_compiler(self) -> Any:
        # Its own lock: building the tokenizer info takes a while for a large vocabulary, and the event loop
        # takes _lock (cached, verdict) meanwhile.
        with self._init_lock:
            if self._compiler is None:
                xgr = _xgrammar()
                info = self._make_info(xgr)
                not_json = _control_tokens(info.decoded_vocab, self.vocab_size)
                self._json_keep = ~not_json if not_json.any() else None    # once, not per sequence
                # xgrammar's own cache is off: ours is the one bound (entries and bytes).
                self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler

    def verdict(self, guided: GuidedDecoding) -> str | None:
        """Without compiling: "" when `guided` compiled, xgrammar's reason when it was refused, None when it was
        never compiled. Remembered longer than the grammars themselves (a digest each), for backends that
        compile elsewhere (TensorRT-LLM) and must not hand over a grammar xgrammar refuses."""
        with self._lock:
            return self._verdicts.get(_digest(guided))

    def cached(self, guided: GuidedDecoding) -> bool:
        """Whether `guided` is compiled already (matcher() will not block); a cached refusal is not. A hit counts
        as a use: the API asks this for every request, so a schema in steady use is not evicted as least
        recently used by a churn of one-off schemas (then compiled again, on the engine's side)."""
        with self._lock:
            hit = self._cache.get(guided)
            if hit is not None:
                self._cache.move_to_end(guided)
        return hit is not None and not isinstance(hit[0], GrammarError)

    def compile(self, guided: GuidedDecoding) -> Any:
        """The compiled grammar (an xgrammar CompiledGrammar); blocking. Raises GrammarError.

        Single-flight: while one caller compiles `guided`, another waits for its result (see in_flight)
        instead of compiling it too. Only a caller already compiling is ever waited for, so waiters cannot
        starve it of a pool thread."""
        with self._lock:
            hit = self._cache.get(guided)
            flight, leader = None, False
            if hit is not None:
                self._cache.move_to_end(guided)
            else:
                flight = self._flights.get(guided)
                if flight is None:
                    leader, flight = True, self._flights.setdefault(guided, _Flight())
        if hit is not None:
            if isinstance(hit[0], GrammarError):
                raise GrammarError(str(hit[0]))
            return hit[0]
        if not leader:
            return _result(flight)
        try:
            hit = self._compile_new(guided)
        except BaseException as exc:     # e.g. over the size bound, xgrammar missing: the waiters get it too
            flight.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._flights.pop(guided, None)
        if isinstance(hit[0], GrammarError):
            flight.set_exception(hit[0])
            raise GrammarError(str(hit[0]))
        flight.set_result(hit[0])
        return hit[0]

    def in_flight(self, guided: GuidedDecoding) -> Future | None:
        """The compile of `guided` running now (its result: the compiled grammar, or GrammarError), if any:
        a caller on the event loop awaits it (asyncio.wrap_future) rather than holding a thread to wait."""
        with self._lock:
            return self._flights.get(guided)

    def _compile_new(self, guided: GuidedDecoding) -> tuple[Any, int]:
        if len(guided.spec.encode()) > MAX_SPEC_BYTES:   # not cached: the key itself would be the cost
            raise GrammarError(f"the {guided.kind} is longer than {MAX_SPEC_BYTES} bytes")
        compiler = self._get_compiler()
        try:
            compiled = self._run_compiler(compiler, guided)
            entry: tuple[Any, int] = (compiled, int(compiled.memory_size_bytes))
        except GrammarError as exc:
            entry = (exc, 0)
        with self._lock:
            self.compiles += 1
            self._verdicts[_digest(guided)] = str(entry[0]) if isinstance(entry[0], GrammarError) else ""
            self._verdicts.move_to_end(_digest(guided))
            if len(self._verdicts) > MAX_VERDICTS:
                self._verdicts.popitem(last=False)
            if guided not in self._cache:
                self._cache[guided] = entry
                self._bytes += entry[1]
                while len(self._cache) > self._max_entries or (self._bytes > self._max_bytes and len(self._cache) > 1):
                    self._bytes -= self._cache.popitem(last=False)[1][1]
            return self._cache.get(guided, entry)

    def _run_compiler(self, compiler: Any, guided: GuidedDecoding) -> Any:
        kind, spec = guided.kind, guided.spec
        if kind == "json_schema":
            _check_schema(spec)
        try:
            if kind == "json_schema":
                compiled = compiler.compile_json_schema(spec, any_whitespace=False)
            elif kind == "json_object":
                compiled = compiler.compile_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False)
            elif kind == "regex":
                compiled = compiler.compile_regex(spec)
            elif kind == "choice":
                compiled = compiler.compile_regex(choice_regex(spec))
            elif kind == "grammar":
                compiled = compiler.compile_grammar(spec)
            else:
                raise GrammarError(f"unknown grammar kind {kind!r}")
        except (RuntimeError, ValueError, TypeError) as exc:
            if isinstance(exc, GrammarError):
                raise
            raise GrammarError(f"the {kind.replace('_', ' ')} was refused: {_clean(exc)}") from None
        if not GrammarState(compiled, self.vocab_size, self._keep(kind)).allowed().any():
            raise GrammarError(f"the {kind.replace('_', ' ')} admits no output")
        return compiled

    def matcher(self, guided: GuidedDecoding, compiled: Any = None) -> GrammarState:
        """A fresh matcher for one sequence (compiles on a cache miss: blocking); `compiled`: what compile()
        returned for `guided` (then nothing compiles, even if the cache evicted it since)."""
        if compiled is None:
            compiled = self.compile(guided)
        return GrammarState(compiled, self.vocab_size, self._keep(guided.kind))

    def cached_matcher(self, guided: GuidedDecoding) -> GrammarState | None:
        """A fresh matcher when `guided` is compiled already, else None: never compiles (safe on the loop)."""
        with self._lock:
            hit = self._cache.get(guided)
            if hit is not None:
                self._cache.move_to_end(guided)      # a use, as in cached()
        if hit is None or isinstance(hit[0], GrammarError):
            return None
        return GrammarState(hit[0], self.vocab_size, self._keep(guided.kind))

    def _keep(self, kind: str) -> np.ndarray | None:
        # xgrammar's JSON strings admit raw control characters (U+0000-U+001F), which JSON forbids
        # (Python's json.loads refuses them); compact JSON has no other place for them either.
        return self._json_keep if kind in ("json_schema", "json_object") else None


class _Flight(Future):
    """One compile's result, for the callers waiting on it (a class of its own: tests watch it). Running
    from the start: a waiter that leaves cannot cancel it for the others."""

    def __init__(self) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()


def _result(flight: Future) -> Any:
    """The flight's compiled grammar; its error raised afresh in this thread (not the leader's traceback)."""
    try:
        return flight.result()
    except GrammarError as exc:
        raise type(exc)(str(exc)) from None


def _check_schema(spec: str) -> None:
    """GrammarError for a schema xgrammar would compile without enforcing it (inferd.engine.schema_check)."""
    try:
        why = unenforced(json.loads(spec))
    except ValueError:
        return                  # not JSON: xgrammar's own message says so
    except RecursionError:
        raise GrammarError("the json schema is nested too deeply") from None
    if why:
        raise GrammarError(f"the json schema is refused {why}")


def _control_tokens(decoded: Sequence[bytes], vocab_size: int) -> np.ndarray:
    """True for each token id whose text holds a byte below 0x20 (special tokens decode empty: never)."""
    banned = np.zeros(vocab_size, dtype=bool)
    controls = bytes(range(32))
    for tid, piece in enumerate(decoded[:vocab_size]):
        if piece and piece.translate(None, controls) != piece:
            banned[tid] = True
    return banned


class GrammarState:
    """One sequence's place in its grammar: the tokens it accepted so far. Used by one thread at a time."""

    __slots__ = ("_matcher", "_bitmask", "_bytes", "_size", "_allowed", "_keep", "failed")

    def __init__(self, compiled: Any, vocab_size: int, keep: np.ndarray | None = None) -> None:
        """`keep`: the token ids that may ever be allowed, whatever the grammar says (one flag per id; None: all)."""
        xgr = _xgrammar()
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._bytes = self._bitmask.numpy().view(np.uint8)   # the same memory, as bytes (little-endian words)
        self._size = vocab_size
        self._keep = keep
        self._allowed: np.ndarray | None = None               # the mask of the current state, once computed
        self.failed = False          # a token it did not allow was accepted: the output cannot follow it any more

    def allowed(self) -> np.ndarray:
        """Which token ids the grammar allows next (bool, one per id up to vocab_size)."""
        if self._allowed is None:
            self._matcher.fill_next_token_bitmask(self._bitmask)
            allowed = np.unpackbits(self._bytes, bitorder="little", count=self._size).view(bool)
            if self._keep is not None:
                allowed &= self._keep
            self._allowed = allowed
        return self._allowed

    def mask(self, row: np.ndarray) -> None:
        """Set the logits of tokens not allowed next to -inf, in place (`row`: one sequence's logits)."""
        allowed = self.allowed()
        n = min(len(row), self._size)
        np.copyto(row[:n], -np.inf, where=~allowed[:n])
        if len(row) > n:
            row[n:] = -np.inf

    def accept(self, token: int) -> bool:
        """Advance by one generated token; False when the grammar does not allow it (state unchanged)."""
        self._allowed = None
        ok = bool(self._matcher.accept_token(int(token)))
        self.failed = self.failed or not ok
        return ok

    @property
    def terminated(self) -> bool:
        """The grammar has ended: the output is complete and a stop token was accepted."""
        return bool(self._matcher.is_terminated())
