"""Fixtures: the real app on an ephemeral loopback port, over sim engines, and clients for it."""
from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import msgspec
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from inferd.api import build_state, make_app
from inferd.api.state import ServerState
from inferd.config.root import AuditConfig, Config, ModelConfig, ServerConfig
from inferd.config.tenants import AdmissionConfig, AuthConfig, TenantConfig
from inferd.engine.base import Engine
from inferd.engine.sim.engine import SimEngine
from tests.conftest import front_processes_for_tests


class Served(msgspec.Struct, kw_only=True):
    base_url: str          # http://127.0.0.1:<port>
    state: ServerState
    app: web.Application
    http: aiohttp.ClientSession
    sdk: AsyncOpenAI

    @property
    def engine(self) -> Engine:
        return next(iter(self.state.engines.values()))

    async def free_kv_blocks(self) -> int:
        """Read from /metrics, as an operator would."""
        async with self.http.get(self.base_url + "/metrics") as resp:
            text = await resp.text()
        m = re.search(r'inferd_kv_cache_blocks\{[^}]*state="free"[^}]*\} (\S+)', text)
        assert m, text
        return int(float(m.group(1)))

    async def metrics_text(self) -> str:
        async with self.http.get(self.base_url + "/metrics") as resp:
            assert resp.status == 200
            return await resp.text()


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of the first `name{...}` sample carrying all `labels` (0 when there is none)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def sim_engine(**overrides) -> SimEngine:
    """The tiny profile: vocab 4096, a few hundred KV blocks; time_scale 0 unless a test needs pacing."""
    kwargs = dict(time_scale=0.0, max_model_len=512, model_name="sim", max_batch_size=64, seed=0)
    kwargs.update(overrides)
    return SimEngine("tiny", **kwargs)


ServeFactory = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve(tmp_path) -> AsyncIterator[ServeFactory]:
    """serve(engines=None, handler_cancellation=False, models=None, tenants=None, **server_config) -> Served;
    torn down after the test. `models`: [models.*] config tables, for what the API reads of them (LoRA
    adapters); `tenants`: [tenants.*] tables (auth is off unless `auth` says otherwise, so requests are
    tenant `local`); `admission`: the [admission] table; `auth`: the [auth] table.

    aiohttp's default (no handler cancellation) is the harder case for noticing a client that left;
    the daemon runs with handler_cancellation=True.
    """
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def factory(engines: dict[str, Engine] | None = None, *, handler_cancellation: bool = False,
                      models: dict[str, ModelConfig] | None = None,
                      tenants: dict[str, TenantConfig] | None = None, admission: AdmissionConfig | None = None,
                      auth: AuthConfig | None = None, **server: object) -> Served:
        engines = engines if engines is not None else {"sim": sim_engine()}
        for engine in engines.values():
            await engine.start()
            cleanups.append(engine.close)
        server.setdefault("front_processes", front_processes_for_tests())
        config = Config(server=ServerConfig(**server), models=models or {}, tenants=tenants or {},
                        admission=admission or AdmissionConfig(), auth=auth or AuthConfig(), audit=AuditConfig(path=str(tmp_path / "audit.jsonl")))
        state = build_state(config, engines)
        cleanups.append(state.tenancy.close)        # its admission dispatchers, after the runner's cleanup
        cleanups.append(state.shadows.close)
        state.started = True
        app = make_app(state)
        runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
        await runner.setup()
        cleanups.append(runner.cleanup)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        base_url = f"http://{host}:{port}"
        http = aiohttp.ClientSession()
        cleanups.append(http.close)
        sdk = AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0)
        cleanups.append(sdk.close)
        return Served(base_url=base_url, state=state, app=app, http=http, sdk=sdk)

    yield factory
    for cleanup in reversed(cleanups):
        await cleanup()


@pytest.fixture
async def served(serve: ServeFactory) -> Served:
    return await serve()


class AdmissionEntries:
    """Counts requests entering an admission queue, with an event per entry: tests wait for "the
    request is queued" on that, not by polling. The queue enters a request synchronously on its
    first step (before it first waits), so once `reached(n)` returns, `n` requests are in it or
    were refused at its door."""

    def __init__(self, queue) -> None:
        self.count = 0
        self._changed = asyncio.Event()
        admit = queue.admit

        async def counted_admit(*args, **kwargs):
            entering = admit(*args, **kwargs)
            self.count += 1
            self._changed.set()          # waiters resume after this task has run the queue's entry step
            return await entering

        queue.admit = counted_admit

    async def reached(self, n: int, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self._reach(n), timeout)

    async def _reach(self, n: int) -> None:
        while self.count < n:
            self._changed.clear()
            await self._changed.wait()
