"""The Files and Batches API tests' daemon: the real daemon on sim engines (time_scale 0), clients of the
official SDK (one per tenant key), and BatchRunners the test starts and stops itself, with events for
each result recorded and each batch ended."""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
from openai import AsyncOpenAI

from inferd.jobs import BatchRunner
from inferd.config.root import load_config
from inferd.daemon.lifecycle import Daemon
from inferd.store import BatchResult, UsageFilter
from inferd.tenancy.keys import KeyHasher, create_key
from tests.daemon.harness import running_daemon, sim_model, write_config

WAIT_S = 10.0
API_KEYS = '[auth]\nmode = "api_key"\nkeys_file = "keys.jsonl"\n'


def jsonl(*lines: dict | str) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def chat_line(custom_id: str, content: str = "hello", model: str = "sim", max_tokens: int = 3, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                     **body}}


class Runs:
    """Events for a runner's observers: results recorded, batches ended."""

    def __init__(self) -> None:
        self.results: list[tuple[str, BatchResult]] = []
        self.ended: dict[str, str] = {}
        self._changed = asyncio.Event()
        self.gate: Callable[[str, BatchResult], object] | None = None

    async def on_result(self, batch_id: str, result: BatchResult) -> None:
        self.results.append((batch_id, result))
        self._changed.set()
        if self.gate is not None:
            await self.gate(batch_id, result)

    def on_end(self, batch_id: str, status: str) -> None:
        self.ended[batch_id] = status
        self._changed.set()

    async def until(self, done: Callable[[], bool]) -> None:
        async def wait() -> None:
            while not done():
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(wait(), WAIT_S)

    async def end_of(self, batch_id: str) -> str:
        await self.until(lambda: batch_id in self.ended)
        return self.ended[batch_id]


class Served(msgspec.Struct, kw_only=True):
    daemon: Daemon
    url: str
    keys_file: Path
    clients: list

    def sdk(self, key: str = "none") -> AsyncOpenAI:
        client = AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)
        self.clients.append(client)
        return client

    @contextlib.asynccontextmanager
    async def runner(self, runs: Runs | None = None, **kw) -> AsyncIterator[BatchRunner]:
        runs = runs or Runs()
        runner = BatchRunner(self.daemon.state, self.url, **{"poll_s": 0.05, "lease_s": 5.0, **kw},
                             on_result=runs.on_result, on_end=runs.on_end)
        await runner.start()
        try:
            yield runner
        finally:
            await runner.close()

    async def batch_ledger_rows(self, tenant: str) -> list:
        rows = await self.daemon.state.ledger.rows(UsageFilter(tenant=tenant))
        return [row for _, row in rows if row.endpoint.startswith("batch:")]


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, extra: str = "", *, keys_for: tuple[str, ...] = ()) -> AsyncIterator[
        tuple[Served, list[str]]]:
    """The daemon; with `keys_for`, auth.mode = "api_key" and an inference key per tenant named."""
    keys_file = tmp_path / "keys.jsonl"
    keys = [create_key(keys_file, KeyHasher(None), t, ("inference",))[1] for t in keys_for]
    path = write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)},
                        (API_KEYS if keys_for else "") + extra)
    async with running_daemon(load_config(path), run_batches=False) as (daemon, _, url):    # runners: the test's
        served = Served(daemon=daemon, url=url, keys_file=keys_file, clients=[])
        try:
            yield served, keys
        finally:
            for client in served.clients:
                await client.close()
