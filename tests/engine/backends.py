"""The engine backends the conformance suite (test_conformance.py) runs against.

Each entry is an async context-manager factory: given the test's pytest `request` (so it can pull
fixtures such as `tiny_artifact` with `request.getfixturevalue`), it yields a started, warmed
engine and closes it afterwards. To put a backend under the suite, add one entry to BACKENDS.

Keep every backend small (a handful of slots, a few dozen KV blocks): the suite must be fast,
and small limits make queueing and capacity effects visible.

Also the helpers backend-specific engine tests share: `started_engines` (a factory fixture's body)
and `json_log` (what an engine logged, as the daemon would write it).
"""
from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import AsyncContextManager

import orjson
import pytest

from inferd.engine.base import Engine
from inferd.observability.log import JsonFormatter

BackendFactory = Callable[[pytest.FixtureRequest], AsyncContextManager[Engine]]


@contextlib.asynccontextmanager
async def running(engine: Engine) -> AsyncIterator[Engine]:
    """Start and warm an engine, and close it however the test ends."""
    await engine.start()
    try:
        await engine.warmup()
        yield engine
    finally:
        await engine.close()


@contextlib.asynccontextmanager
async def started_engines(build: Callable[..., Engine]) -> AsyncIterator[Callable[..., Awaitable[Engine]]]:
    """A factory for a test's engines: `await make(**kwargs)` builds one with `build`, starts it (no
    warmup, so tests see a cold engine), and every engine it made is closed when the block ends."""
    made: list[Engine] = []

    async def make(*args, **kwargs) -> Engine:
        engine = build(*args, **kwargs)
        made.append(engine)            # closed even if start fails half-way
        await engine.start()
        return engine

    try:
        yield make
    finally:
        for engine in made:
            await engine.close()


def sim(request: pytest.FixtureRequest) -> AsyncContextManager[Engine]:
    from inferd.engine.sim.engine import SimEngine

    # time_scale 0.05: steps of ~0.1 ms, so streams interleave with the test like a real engine's
    return running(SimEngine("tiny", num_kv_blocks=48, block_size=16, max_batch_size=4, max_num_tokens=64,
                             max_model_len=256, time_scale=0.05))


def reference(request: pytest.FixtureRequest) -> AsyncContextManager[Engine]:
    from inferd.engine.reference.engine import ReferenceEngine

    return running(ReferenceEngine(request.getfixturevalue("tiny_artifact"), num_kv_blocks=48, block_size=16,
                                   max_batch_size=4, max_num_tokens=64))


def torch_cpu(request: pytest.FixtureRequest) -> AsyncContextManager[Engine]:
    # The torch engine on the CPU path, float32. cuda_graphs on: decode steps go through the same
    # fixed-size ladder buffers a GPU replays as CUDA graphs (run eagerly here), so that path is covered too.
    pytest.importorskip("torch")
    from inferd.engine.torch.engine import TorchEngine

    return running(TorchEngine(request.getfixturevalue("tiny_artifact"), num_kv_blocks=48, block_size=16,
                               max_batch_size=4, max_num_tokens=64, device="cpu", dtype="float32", cuda_graphs=True))


def trtllm(request: pytest.FixtureRequest) -> AsyncContextManager[Engine]:
    # TensorRT-LLM cannot be installed here: run TrtllmEngine on its test double (on sys.path only here)
    from tests.trtllm_double.harness import trtllm_on_double

    return trtllm_on_double(request.getfixturevalue("tiny_artifact"), request.getfixturevalue("tmp_path"))


BACKENDS: dict[str, BackendFactory] = {
    "reference": reference,
    "sim": sim,
    "torch": torch_cpu,
    "trtllm": trtllm,
}


@contextlib.contextmanager
def json_log(logger_name: str) -> Iterator[list[dict]]:
    """The JSON lines `logger_name` writes inside the block (as the daemon formats them), parsed.

    Lines written from any thread count; the list is filled when the block ends.
    """
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(logger_name)
    lines: list[dict] = []
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        lines.extend(orjson.loads(line) for line in buffer.getvalue().splitlines())
