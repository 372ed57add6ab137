"""The daemon's lifecycle, run in-process on an ephemeral port, and once as a real subprocess."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web

from inferd.api.state import ServerState
from inferd.config.root import parse_config, with_overrides
from inferd.daemon.lifecycle import Daemon
from inferd.daemon.sdnotify import Notifier
from inferd.models.factory import build_engine
from inferd.observability.garbage import GEN0_THRESHOLD
from inferd.types import GenerationRequest, SamplingParams
from tests.daemon.harness import running_daemon


def sim_config(*, drain_grace_s: float = 30.0, time_scale: float = 0.01):
    """A config serving the simulator (by default 100x faster than its tiny profile) on any free port."""
    raw_model = {"backend": "sim", "max_batch_size": 4, "max_num_tokens": 64, "num_kv_blocks": 64,
                 "sim": {"profile": "tiny", "time_scale": time_scale, "max_model_len": 1024}}
    return parse_config({"server": {"port": 0, "drain_grace_s": drain_grace_s}, "models": {"sim": raw_model}})


class LifecycleApp:
    """A minimal app over ServerState, standing in for inferd.api until it lands.

    /hold     counts as in flight (state.track) until the test sets `release`.
    /generate runs a request through the sim engine and answers with its finish reason.
    """

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.state: ServerState | None = None

    def __call__(self, state: ServerState) -> web.Application:
        self.state = state
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/hold", self.hold)
        app.router.add_get("/generate", self.generate)
        return app

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": self.state.ready()}, status=200 if self.state.ready() else 503)

    async def hold(self, request: web.Request) -> web.Response:
        with self.state.track():
            self.entered.set()
            await self.release.wait()
            return web.json_response({"released": True})

    async def generate(self, request: web.Request) -> web.Response:
        max_tokens = int(request.query.get("max_tokens", "8"))
        with self.state.track():
            stream = self.state.engines["sim"].submit(GenerationRequest(
                request_id=uuid.uuid4().hex, prompt_token_ids=(1, 2, 3),
                sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)))
            tokens = 0
            async for delta in stream:
                tokens += len(delta.token_ids)
                if tokens:
                    self.entered.set()
            return web.json_response({"finish_reason": delta.finish_reason.value, "tokens": tokens})


async def test_serves_on_ephemeral_port_and_stops_with_exit_zero():
    app = LifecycleApp()
    async with running_daemon(sim_config(), app_factory=app) as (daemon, task, url):
        assert daemon.port and daemon.port != 0
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{url}/readyz") as resp:
                assert resp.status == 200
            async with http.get(f"{url}/generate?max_tokens=5") as resp:
                assert await resp.json() == {"finish_reason": "length", "tokens": 5}
        engine = daemon.state.engines["sim"]
        assert engine.info.simulated
        daemon.request_stop()
        assert await task == 0
        assert not engine.healthy


async def test_drain_waits_for_in_flight_request_then_closes_engines():
    app = LifecycleApp()
    async with running_daemon(sim_config(), app_factory=app) as (daemon, task, url):
        async with aiohttp.ClientSession() as http:
            held = asyncio.ensure_future(http.get(f"{url}/hold"))
            await app.entered.wait()
            daemon.request_stop()
            while not daemon.state.draining:  # the drain starts on the daemon's next turn
                await asyncio.sleep(0)
            assert not daemon.state.ready()
            assert not task.done()
            assert daemon.state.engines["sim"].healthy  # engines stay up while a request is in flight
            app.release.set()
            resp = await held
            assert resp.status == 200 and await resp.json() == {"released": True}
            resp.release()
        assert await task == 0
        assert not daemon.state.engines["sim"].healthy


async def test_stopped_daemon_no_longer_accepts_connections():
    app = LifecycleApp()
    async with running_daemon(sim_config(), app_factory=app) as (daemon, task, url):
        daemon.request_stop()
        assert await task == 0
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientConnectionError):
                await http.get(f"{url}/healthz")


async def test_drain_grace_expiry_aborts_streams_and_exits_zero():
    app = LifecycleApp()
    # real-time tiny profile: ~2.5 ms per token, so 900 tokens outlast the 50 ms grace by far
    config = sim_config(drain_grace_s=0.05, time_scale=1.0)
    async with running_daemon(config, app_factory=app) as (daemon, task, url):
        async with aiohttp.ClientSession() as http:
            long = asyncio.ensure_future(http.get(f"{url}/generate?max_tokens=900"))
            await app.entered.wait()
            daemon.request_stop()
            resp = await long
            body = await resp.json()
            assert body["finish_reason"] == "abort"
            assert 0 < body["tokens"] < 900
        assert await task == 0


async def test_second_stop_skips_the_drain_and_exits_nonzero():
    app = LifecycleApp()
    async with running_daemon(sim_config(), app_factory=app) as (daemon, task, url):
        async with aiohttp.ClientSession() as http:
            held = asyncio.ensure_future(http.get(f"{url}/hold"))
            await app.entered.wait()
            daemon.request_stop()
            daemon.request_stop()
            assert await task == 1       # did not wait the 30 s grace for /hold
            with pytest.raises(aiohttp.ClientError):
                await held


async def test_stop_during_startup_closes_what_was_started():
    started, closed = asyncio.Event(), []
    gate = asyncio.Event()

    def slow_factory(name, model, server):
        engine = build_engine(name, model, server)
        original_warmup, original_close = engine.warmup, engine.close

        async def warmup():
            await original_warmup()
            started.set()
            await gate.wait()  # never set: startup is stuck in warmup until stopped

        async def close():
            closed.append(name)
            await original_close()

        engine.warmup, engine.close = warmup, close
        return engine

    daemon = Daemon(sim_config(), app_factory=LifecycleApp(), engine_factory=slow_factory)
    task = asyncio.ensure_future(daemon.run())
    await started.wait()
    daemon.request_stop()
    assert await task == 0
    assert closed == ["sim"]
    assert not daemon.ready.is_set()


async def test_failed_startup_exits_one_and_closes_started_engines():
    closed = []

    def factory(name, model, server):
        engine = build_engine(name, model, server)
        original_close = engine.close

        async def close():
            closed.append(name)
            await original_close()

        engine.close = close
        return engine

    def broken_app(state):
        raise RuntimeError("app cannot be built")

    daemon = Daemon(sim_config(), app_factory=broken_app, engine_factory=factory)
    assert await daemon.run() == 1
    assert closed == ["sim"]


async def test_tells_systemd_ready_then_stopping(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.setblocking(False)
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify")})
    daemon = Daemon(sim_config(), app_factory=LifecycleApp(), notifier=notifier)
    try:
        task = asyncio.ensure_future(daemon.run())
        await daemon.ready.wait()
        assert sock.recv(4096).startswith(b"READY=1\nSTATUS=serving sim on 127.0.0.1:")
        daemon.request_stop()
        assert await task == 0
        assert sock.recv(4096).startswith(b"STOPPING=1")
    finally:
        sock.close()


async def test_reload_without_a_config_file_logs_and_keeps_serving(caplog):
    app = LifecycleApp()
    async with running_daemon(sim_config(), app_factory=app) as (daemon, task, url):
        assert await daemon.reload() is None
        assert logged(caplog, "reload_skipped")[0]["reason"] == "no config file"
        assert daemon.state.ready()


# -- with the real HTTP app ----------------------------------------------------------------


def reference_config(engines_root, artifact: str = "tiny"):
    return parse_config({
        "server": {"port": 0, "engines_root": str(engines_root)},
        "models": {"tiny": {"artifact": artifact, "max_batch_size": 4, "max_num_tokens": 64,
                            "num_kv_blocks": 64}},
    })


@contextlib.asynccontextmanager
async def serving(config) -> AsyncIterator[tuple[Daemon, str]]:
    """The full daemon with inferd.api's app; stopped (drained) on exit."""
    async with running_daemon(config, drain=True) as (daemon, task, url):
        yield daemon, url
    assert task.result() == 0


async def test_reference_engine_serves_completions_and_metrics(tiny_engines_root):
    async with serving(reference_config(tiny_engines_root)) as (daemon, url):
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/readyz") as resp:
                assert resp.status == 200
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                assert (await resp.json())["usage"]["completion_tokens"] == 3
            async with http.get(f"{url}/metrics") as resp:
                metrics = await resp.text()
    version = daemon.state.engines["tiny"].info.version
    assert (f'inferd_requests_total{{backend="reference",model="tiny",status="200",version="{version}"}} 1.0'
            in metrics)
    assert 'inferd_kv_cache_blocks{backend="reference",model="tiny",state="free"' in metrics
    # Engine steps are labelled with the engine that ran them (warmup and the request both stepped).
    assert f'inferd_engine_step_seconds_count{{backend="reference",model="tiny",version="{version}"}}' in metrics


async def test_stream_in_flight_at_sigterm_finishes_normally_with_the_real_app():
    # real-time tiny profile: ~2.5 ms per token, so the stream is mid-way when the stop arrives
    async with serving(sim_config(time_scale=1.0)) as (daemon, url):
        async with aiohttp.ClientSession() as http:
            body = {"model": "sim", "prompt": "hi", "max_tokens": 60, "stream": True}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                first = await resp.content.readline()
                assert first.startswith(b"data: ")
                daemon.request_stop()
                rest = (await resp.read()).decode()
            assert daemon.state.draining
    finals = [orjson.loads(line[6:]) for line in rest.splitlines()
              if line.startswith("data: {") and '"finish_reason":"length"' in line]
    assert len(finals) == 1
    assert rest.rstrip().endswith("data: [DONE]")


async def test_while_draining_the_listener_stays_open_for_probes_and_refuses_new_work_with_503():
    async with serving(sim_config(time_scale=1.0)) as (daemon, url):
        async with aiohttp.ClientSession() as http, aiohttp.ClientSession() as fresh:
            body = {"model": "sim", "prompt": "hi", "max_tokens": 200, "stream": True}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert (await resp.content.readline()).startswith(b"data: ")
                daemon.request_stop()
                while not daemon.state.draining:      # the drain starts on the daemon's next turn
                    await asyncio.sleep(0)
                # a load balancer's probe on a new connection sees the node leaving, not a refused connect
                async with fresh.get(f"{url}/readyz") as probe:
                    assert probe.status == 503 and "draining" in await probe.text()
                async with fresh.post(f"{url}/v1/completions", json={**body, "stream": False}) as refused:
                    assert refused.status == 503 and (await refused.json())["error"]["code"] == "draining"
                    assert refused.headers["Retry-After"]
                rest = (await resp.read()).decode()
            assert rest.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in rest


def logged(caplog, event: str) -> list[dict]:
    """Fields of every captured log line with this event name."""
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == event]


async def test_first_run_builds_the_missing_synthetic_artifact(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="inferd.daemon")
    engines_root = tmp_path / "engines"
    async with serving(reference_config(engines_root)) as (daemon, url):
        assert daemon.state.engines["tiny"].info.backend == "reference"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/v1/models") as resp:
                assert [m["id"] for m in (await resp.json())["data"]] == ["tiny"]
    assert logged(caplog, "building_engine")[0]["kind"] == "tiny"
    assert logged(caplog, "engine_built")
    assert len([p for p in (engines_root / "tiny").iterdir() if p.is_dir() and not p.name.startswith(".")]) == 1


async def test_missing_non_synthetic_artifact_fails_startup_naming_the_model(tmp_path, caplog):
    daemon = Daemon(reference_config(tmp_path, artifact="llama-3-8b"))
    assert await daemon.run() == 1
    (failure,) = logged(caplog, "startup_failed")
    assert failure["error"].startswith("models.tiny: artifact 'llama-3-8b'")


async def test_port_in_use_fails_startup_before_any_engine_loads(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = with_overrides(sim_config(), port=port)
        daemon = Daemon(config, app_factory=LifecycleApp())
        assert await daemon.run() == 1
    (failure,) = logged(caplog, "startup_failed")
    assert failure["error_type"] == "BindError" and f"127.0.0.1:{port}" in failure["error"]
    assert daemon.state is None                       # no engine was loaded, so none had to be closed


async def test_the_port_is_bound_first_and_answers_503_starting_until_the_daemon_is_ready():
    app = LifecycleApp()
    daemon = Daemon(with_overrides(sim_config(), port=0), app_factory=app)
    entered = asyncio.Event()
    load_versions = daemon._load_versions

    async def slow_load(stack):           # engines "load" until the test has looked at the port
        entered.set()
        await release.wait()
        return await load_versions(stack)

    release = asyncio.Event()
    daemon._load_versions = slow_load
    task = asyncio.ensure_future(daemon.run())
    await asyncio.wait_for(entered.wait(), 10.0)
    port = daemon.port                                # bound before the engines load
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))               # the port is ours already
    async with aiohttp.ClientSession() as http:       # answering already: 503 `starting`, not refused
        async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
            assert resp.status == 503 and (await resp.json())["status"] == "starting"
    release.set()
    await asyncio.wait_for(daemon.ready.wait(), 10.0)
    assert daemon.port == port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.close()
    await writer.wait_closed()
    daemon.request_stop()
    assert await task == 0


# -- as a real process -----------------------------------------------------------------------


async def read_event(proc: asyncio.subprocess.Process, event: str, seen: list[dict]) -> dict:
    """Read the daemon's JSON log lines until one has `event`; keep every line in `seen`."""
    while True:
        raw = await proc.stderr.readline()
        if not raw:
            pytest.fail(f"daemon exited before logging {event!r}; its log: {seen}")
        with contextlib.suppress(ValueError):
            line = orjson.loads(raw)
            seen.append(line)
            if line.get("event") == event:
                return line


async def test_serve_subprocess_reports_port_serves_and_exits_zero_on_sigterm(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        '[server]\nport = 8000\ndrain_grace_s = 5.0\n'
        '[models.sim]\nbackend = "sim"\nmax_batch_size = 4\nmax_num_tokens = 64\nnum_kv_blocks = 64\n'
        '[models.sim.sim]\nprofile = "tiny"\ntime_scale = 0.01\nmax_model_len = 512\n')
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferd", "serve", "--config", str(config), "--port", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    seen: list[dict] = []
    try:
        listening = await asyncio.wait_for(read_event(proc, "listening", seen), 60)
        assert listening["host"] == "127.0.0.1" and listening["port"] > 0
        url = f"http://127.0.0.1:{listening['port']}"
        async with aiohttp.ClientSession() as http:
            body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                assert resp.headers["X-Inferd-Simulated"] == "true"
            async with http.get(f"{url}/metrics") as resp:
                metrics = await resp.text()
        # Serving, it collects less often (inferd.observability.garbage), and the collector's pauses are timed.
        ready = next((line for line in seen if line.get("event") == "ready"), None) \
            or await asyncio.wait_for(read_event(proc, "ready", seen), 30)
        assert ready["gc_thresholds"][0] == GEN0_THRESHOLD
        assert re.search(r'^inferd_gc_pause_seconds_count\{generation="0"\} \S+$', metrics, re.M) is not None
        proc.send_signal(signal.SIGHUP)
        await asyncio.wait_for(read_event(proc, "reloaded", seen), 30)
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(read_event(proc, "stopped", seen), 30)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert not any("hi" == line.get("content") for line in seen)
