"""Live key management through the real daemon: `inferd keys create|revoke` take effect without SIGHUP,
a malformed keys file keeps the old keys, and every change lands in the audit log, whose chain verifies
and whose seq continues across restarts."""
from __future__ import annotations

import asyncio
import types
from pathlib import Path

import aiohttp
import pytest

from inferd.observability.audit import read_audit, verify_audit
from inferd.tenancy import key_reload
from inferd.tenancy.keys_cli import keys_main
from tests.daemon.harness import running, sim_model, write_config

AUTH = '[auth]\nmode = "api_key"\nkeys_file = "keys.jsonl"\n'
WAIT_S = 5.0


@pytest.fixture(autouse=True)
def fast_poll(monkeypatch):
    monkeypatch.setattr(key_reload, "KEYS_POLL_INTERVAL_S", 0.05)


def cli(config: Path, command: str, capsys, **args) -> str:
    """Run `inferd keys <command>` (the CLI function); returns what it printed."""
    assert keys_main(types.SimpleNamespace(config=str(config), keys_command=command, **args)) == 0
    return capsys.readouterr().out.strip()


async def status_with(http: aiohttp.ClientSession, url: str, key: str) -> int:
    body = {"model": "m", "prompt": "hello", "max_tokens": 2}
    async with http.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        await resp.read()
        return resp.status


async def after_poll(daemon, action) -> None:
    """Do `action` (off the loop, as a separate `inferd keys` process would) and wait for the daemon's
    keys poll to apply what it changed."""
    keys = daemon.state.tenancy.keys
    seen = keys.generation
    await asyncio.to_thread(action)
    await asyncio.wait_for(keys.changed(seen), WAIT_S)


async def audit_records(daemon, path: Path) -> list[dict]:
    await asyncio.to_thread(daemon.control.audit.flush)
    return read_audit(path)


async def test_created_key_works_and_revoked_key_is_refused_without_sighup(tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", {"m": sim_model()}, AUTH)
    async with running(config) as (daemon, url), aiohttp.ClientSession() as http:
        key = None

        def create() -> None:
            nonlocal key
            key = cli(config, "create", capsys, tenant="acme", scope=None)

        await after_poll(daemon, create)
        assert await status_with(http, url, key) == 200
        key_id = key.split("_")[1]
        await after_poll(daemon, lambda: cli(config, "revoke", capsys, key_id=key_id))
        assert await status_with(http, url, key) == 401
        records = await audit_records(daemon, tmp_path / "audit.jsonl")
        assert [(r["action"], r["target"], r["actor"]) for r in records] == [
            ("key.create", key_id, "system"), ("key.revoke", key_id, "system")]
        assert key.split("_", 2)[2] not in (tmp_path / "audit.jsonl").read_text()
        assert verify_audit(tmp_path / "audit.jsonl").ok


async def test_malformed_keys_file_keeps_old_keys_and_counts_the_failure(tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", {"m": sim_model()}, AUTH)
    keys_file = tmp_path / "keys.jsonl"
    async with running(config) as (daemon, url), aiohttp.ClientSession() as http:
        key = None

        def create() -> None:
            nonlocal key
            key = cli(config, "create", capsys, tenant="acme", scope=None)

        await after_poll(daemon, create)
        await after_poll(daemon, lambda: keys_file.write_bytes(keys_file.read_bytes() + b'{"key_id": "tr'))
        assert await status_with(http, url, key) == 200
        assert daemon.state.tenancy.metrics_snapshot()["keys_reloads"] == {"success": 1, "error": 1}
        exposition = daemon.state.metrics.render()[0].decode()
        assert 'inferd_keys_reload_total{result="error"} 1.0' in exposition
        assert 'inferd_keys_reload_total{result="success"} 1.0' in exposition
        records = await audit_records(daemon, tmp_path / "audit.jsonl")
        assert records[-1]["action"] == "keys.reload_failed" and "keys.jsonl:2" in records[-1]["detail"]["error"]


async def test_audit_seq_continues_across_daemon_restarts(tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", {"m": sim_model()}, AUTH)
    for tenant in ("first", "second"):
        async with running(config) as (daemon, _):
            await after_poll(daemon, lambda: cli(config, "create", capsys, tenant=tenant, scope=None))
            assert (await daemon.reload()).ok
    records = read_audit(tmp_path / "audit.jsonl")
    assert [r["action"] for r in records] == ["key.create", "config.reload"] * 2
    assert [r["seq"] for r in records] == [1, 2, 3, 4]
    verdict = verify_audit(tmp_path / "audit.jsonl")
    assert verdict.ok and verdict.records == 4
