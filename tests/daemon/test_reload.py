"""SIGHUP reload through the real daemon: invalid files change nothing; valid ones apply the difference
without failing a request or cutting a stream; systemd hears READY / RELOADING / READY / STOPPING."""
from __future__ import annotations

import asyncio
import socket

import aiohttp

from inferd.daemon.sdnotify import Notifier
from inferd.observability.audit import read_audit
from inferd.tenancy.keys import KeyHasher, create_key
from inferd.types import ModelVersion
from tests.daemon.harness import complete, running, sim_model, stream, write_config


def reload_counts(daemon) -> dict[str, float]:
    counter = daemon.state.metrics.config_reload_total
    return {s.labels["result"]: s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")}


async def test_invalid_reload_changes_nothing_and_counts_an_error(tmp_path, caplog):
    path = write_config(tmp_path / "c.toml", {"m": sim_model(["v1"])},
                        '[aliases.chat]\nsplit = { "m@v1" = 1 }\n')
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        table_before, config_before = daemon.state.registry.table, daemon.state.config
        path.write_text(path.read_text() + '[aliases.chat2]\nsplit = { "nope" = 1 }\n[models.m.bogus]\n')
        result = await daemon.reload()
        assert not result.ok
        assert any("aliases.chat2" in e for e in result.errors) and any("models.m.bogus" in e for e in result.errors)
        assert daemon.state.registry.table is table_before and daemon.state.config is config_before
        assert reload_counts(daemon)["error"] == 1 and reload_counts(daemon)["success"] == 0
        status, headers, _ = await complete(http, url, "chat")
        assert status == 200 and headers["X-Inferd-Model-Version"] == "v1+simulated"
        assert any(r.getMessage() == "reload_failed" or "reload_failed" in r.getMessage() for r in caplog.records)


async def test_reload_adds_a_version_moves_an_alias_and_removes_a_version_while_streams_run(tmp_path):
    # time_scale 3: a 300-token stream takes about 2 s, so it spans the whole reload.
    path = write_config(tmp_path / "c.toml", {"m": sim_model(["v1", "v2"], time_scale=3.0)},
                        '[aliases.chat]\nsplit = { "m@v1" = 1 }\n')
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        started = [asyncio.Event() for _ in range(4)]
        streams = [asyncio.ensure_future(stream(http, url, model, 300, ev))
                   for model, ev in zip(["chat", "chat", "m@v2", "m@v2"], started)]
        await asyncio.gather(*(ev.wait() for ev in started))
        # During the reload, keep sending short requests to the alias: none may fail.
        stop = asyncio.Event()

        async def steady() -> list[tuple[int, str]]:
            out = []
            while not stop.is_set():
                status, headers, _ = await complete(http, url, "chat", max_tokens=2)
                out.append((status, headers.get("X-Inferd-Model-Version", "")))
            return out

        traffic = asyncio.ensure_future(steady())
        path.write_text(path.read_text().replace('versions = ["v1", "v2"]', 'versions = ["v1", "v3"]')
                        .replace('"m@v1" = 1', '"m@v3" = 1'))
        result = await daemon.reload()
        assert result.ok and result.loaded == ("m@v3",) and result.retired == ("m@v2",)
        table = daemon.state.registry.table
        assert table.state(ModelVersion("m", "v2")) == "retired"     # no new requests, streams keep going
        assert daemon.state.versions.in_use(ModelVersion("m", "v2")) == 2
        status, headers, _ = await complete(http, url, "chat")
        assert status == 200 and headers["X-Inferd-Model-Version"] == "v3+simulated"
        status, _, body = await complete(http, url, "m@v2")
        assert status == 404 and body["error"]["code"] == "model_version_not_found"
        stop.set()
        done = await asyncio.gather(*streams)
        assert [d[:2] for d in done] == [(200, "length")] * 4
        assert [d[3] for d in done] == ["m@v1+simulated"] * 2 + ["m@v2+simulated"] * 2
        assert all(status == 200 for status, _ in await traffic)
        await daemon.reloader.wait_retired()
        assert ModelVersion("m", "v2") not in daemon.state.registry.table.versions
        assert reload_counts(daemon)["success"] == 1


async def test_systemd_hears_ready_reloading_ready_stopping_in_order(tmp_path):
    path = write_config(tmp_path / "c.toml", {"m": sim_model()})
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.setblocking(False)
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "60000000"})
    try:
        async with running(path, notifier=notifier) as (daemon, url):
            assert (await daemon.reload()).ok
            daemon.request_stop()     # the context then waits for a clean exit
        messages = []
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except BlockingIOError:
                break
    finally:
        sock.close()
    kinds = [m.split("\n")[0] for m in messages if not m.startswith("WATCHDOG=1")]
    assert kinds == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
    reloading = next(m for m in messages if m.startswith("RELOADING=1"))
    assert "\nMONOTONIC_USEC=" in reloading
    assert "WATCHDOG=1" in messages   # pinged from the event loop once serving


async def test_failed_reload_is_audited_with_its_errors(tmp_path):
    path = write_config(tmp_path / "c.toml", {"m": sim_model()})
    async with running(path) as (daemon, _):
        path.write_text(path.read_text() + "[models.m.bogus]\n")
        assert not (await daemon.reload()).ok
        await asyncio.to_thread(daemon.control.audit.flush)
    (record,) = read_audit(tmp_path / "audit.jsonl")
    assert record["action"] == "config.reload_failed" and record["actor"] == "system"
    assert any("models.m.bogus" in e for e in record["detail"]["errors"])


async def test_reload_with_a_malformed_keys_file_counts_an_error_and_keeps_the_keys(tmp_path):
    path = write_config(tmp_path / "c.toml", {"m": sim_model()}, '[auth]\nmode = "api_key"\nkeys_file = "keys.jsonl"\n')
    keys_file = tmp_path / "keys.jsonl"
    _, key = create_key(keys_file, KeyHasher(None), "acme")
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        config_before = daemon.state.config
        keys_file.write_text(keys_file.read_text() + "not json\n")
        result = await daemon.reload()
        assert not result.ok and any("keys.jsonl:2" in e for e in result.errors)
        assert reload_counts(daemon)["error"] == 1 and reload_counts(daemon)["success"] == 0
        assert daemon.state.config is config_before
        body = {"model": "m", "prompt": "hello", "max_tokens": 2}
        async with http.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
            assert resp.status == 200
        await asyncio.to_thread(daemon.control.audit.flush)
    actions = [r["action"] for r in read_audit(tmp_path / "audit.jsonl")]
    assert actions[-1] == "config.reload_failed" and "config.reload" not in actions


async def test_a_reload_that_changes_front_processes_keeps_it_and_warns_it_needs_a_restart(tmp_path, caplog):
    path = write_config(tmp_path / "c.toml", {"m": sim_model(["v1"])})
    path.write_text(path.read_text().replace("[server]\n", "[server]\nfront_processes = 0\n", 1))
    async with running(path) as (daemon, url):
        path.write_text(path.read_text().replace("front_processes = 0\n", "front_processes = 2\n", 1))
        result = await daemon.reload()
        assert result.ok
        assert daemon.state.config.server.front_processes == 0
        kept = [getattr(r, "fields", {}).get("settings", []) for r in caplog.records
                if r.getMessage() == "reload_needs_restart"]
        assert kept and "server.front_processes" in kept[-1]
