"""A request's grammar (Prepared.guided), compiled before it is charged or queued: a schema the engine
cannot serve is a 400 naming the field that asked for it, never a failure inside the engine.

The compile runs in GRAMMAR_POOL, a few threads of its own (a TokenizerPool, as tokenization's), so it never
blocks the event loop, and it counts against the request's deadline: a 504 when it passes. Its own pool,
not tokenization's: xgrammar cannot be interrupted, and a 50-byte schema can take seconds to compile (a
`pattern` of `[a-z]{0,10000}`: 5 s), so two such requests with a short `timeout` held both tokenize threads
for seconds after their 504s, and every long prompt behind them timed out too. Now they hold at most
GRAMMAR_WORKERS compile threads; compiles queued behind those are dropped when their request leaves or its
deadline passes, and cached grammars need no thread at all. The
engine's Grammars caches compiled grammars (and refusals) per tokenizer, so a second request with the
same schema compiles nothing (nor waits for a pool thread); the engine finds it in that cache when it builds
the request's matcher. A refusal is remembered too (Grammars.verdict): a client repeating a bad schema gets
its 400 at once, even while slow compiles hold every pool thread. A request whose grammar another request
is compiling now awaits that compile (Grammars.in_flight) on the loop: N identical requests hold one thread.
"""
from __future__ import annotations

from inferd.api.errors import TIMEOUT, ApiError, invalid
from inferd.api.pipeline.prompt_tokens import TokenizerPool, wait
from inferd.api.wire.openai import Prepared
from inferd.engine import Engine, GrammarError, GrammarUnavailable

GRAMMAR_WORKERS = 2        # grammar compiles at once, process-wide (xgrammar's compiler uses 2 threads each)
GRAMMAR_POOL = TokenizerPool(GRAMMAR_WORKERS, name="inferd-grammar")

# GuidedDecoding.kind -> the error code of a grammar the engine refuses
REFUSED_CODES = {"json_schema": "invalid_schema", "json_object": "invalid_schema", "regex": "invalid_regex",
                 "choice": "invalid_choice", "grammar": "invalid_grammar"}


async def compile_guided(engine: Engine, p: Prepared, deadline: float) -> None:
    """Compile `p.guided` with `engine`'s grammars (off the loop, cached); 400 naming `p.guided_param`
    when this engine cannot constrain, xgrammar is missing, or it refuses the grammar; 504 past `deadline`."""
    guided, param = p.guided, p.guided_param
    if guided is None:
        return
    grammars = engine.grammars
    if grammars is None:
        raise invalid(f"{param}: structured output is not supported by the {engine.info.backend} backend.",
                      param=param, code="unsupported_parameter")
    if grammars.cached(guided):        # compiled for an earlier request: nothing to wait for
        return
    refused = grammars.verdict(guided)
    try:
        if refused:                    # refused for an earlier request: the same 400, without a pool thread
            raise GrammarError(refused)
        flight = grammars.in_flight(guided)
        if flight is not None:         # another request is compiling it: await that compile, on no thread
            await wait(flight, deadline, shield=True)
        else:
            await GRAMMAR_POOL.run(lambda: grammars.compile(guided), deadline)
    except GrammarUnavailable:
        raise invalid(f"{param}: structured output needs xgrammar, which this server lacks (install "
                      "inferd[structured]).", param=param, code="structured_output_unavailable") from None
    except GrammarError as exc:
        raise invalid(f"{param}: {exc}.", param=param, code=REFUSED_CODES.get(guided.kind, "invalid_grammar")) \
            from None
    except ApiError as exc:
        if exc.status != 504:
            raise
        raise ApiError(504, f"The request's deadline passed while its {param} grammar compiled.", type=TIMEOUT,
                       code="deadline") from None
