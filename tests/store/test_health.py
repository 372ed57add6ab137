"""The store's health is part of readiness, through the real daemon: a PostgreSQL server that stops
answering (SIGSTOP: no RST, like a partitioned server; or shut down) turns /readyz 503 `store_unavailable` and fails
requests fast with 503 + Retry-After, instead of holding them until their deadline; when it answers again,
/readyz is 200 and requests succeed. A SQLite file that cannot grow (full disk) marks readiness too."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from inferd.config.root import load_config
from tests.daemon.harness import running_daemon, sim_model, until, write_config
from tests.pg_server import PgServer, pg_dsn, pg_server  # noqa: F401  (fixtures)

BODY = {"model": "sim", "prompt": "hello there", "max_tokens": 5, "temperature": 0}
PROBES = "ping_interval_s = 0.2\nping_timeout_s = 0.5\ntimeout_s = 2\n"


def server_pids(server: PgServer) -> list[int]:
    """The postmaster and its children (backends, checkpointer, ...): stopping only the postmaster
    leaves the backends answering."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            pids.append(int(stat.parent.name))
    return pids


def signal_server(server: PgServer, sig: int) -> None:
    for pid in server_pids(server):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def pause(server: PgServer, mode: str) -> None:
    """"sigstop": every server process stopped (no RST, like a partitioned server); "stop": shut down at
    once (`pg_ctl stop -m immediate`: its connections are reset)."""
    if mode == "sigstop":
        signal_server(server, signal.SIGSTOP)
    else:
        server._run("pg_ctl", "stop", "-D", str(server.data), "-m", "immediate", "-w", "-t", "10", timeout=20)


def resume(server: PgServer, mode: str) -> None:
    """The server answers again: SIGCONT, or started again on its port with the options it had."""
    if mode == "sigstop":
        signal_server(server, signal.SIGCONT)
        return
    opts = (f"-p {server.port} -k {server.dir} -c listen_addresses=127.0.0.1 -c fsync=on "
            "-c max_connections=200 -c shared_buffers=32MB")
    server._run("pg_ctl", "start", "-D", str(server.data), "-l", str(server.log), "-w", "-t", "15", "-o", opts,
                timeout=20)


async def readyz(http: aiohttp.ClientSession, url: str) -> tuple[int, list[str]]:
    async with http.get(url + "/readyz") as resp:
        return resp.status, (await resp.json()).get("reasons", [])


async def store_unready(http: aiohttp.ClientSession, url: str) -> bool:
    status, reasons = await readyz(http, url)
    return status == 503 and any(r.startswith("store_unavailable") for r in reasons)


async def ready(http: aiohttp.ClientSession, url: str) -> bool:
    return (await readyz(http, url))[0] == 200


async def assert_store_unavailable(resp: aiohttp.ClientResponse) -> None:
    assert resp.status == 503, await resp.text()
    assert int(resp.headers["Retry-After"]) >= 1
    assert (await resp.json())["error"]["code"] == "store_unavailable"


@pytest.mark.parametrize("mode", ["sigstop", "stop"])
async def test_a_postgres_server_that_stops_answering_turns_readyz_503_and_fails_requests_fast(
        tmp_path, pg_server, pg_dsn, mode):  # noqa: F811
    config = load_config(write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=1.0)},
                                      f'[store]\nbackend = "postgres"\ndsn = "{pg_dsn}"\n{PROBES}'))
    async with running_daemon(config) as (daemon, _, url), aiohttp.ClientSession() as http:
        # The server was paused by the other case just before: a first ping may still find it waking.
        await until(lambda: ready(http, url), "/readyz to be 200 at start", timeout_s=30)
        slow = {**BODY, "max_tokens": 1000, "ignore_eos": True}     # generating for about 2 s
        headers = {"X-Request-Timeout": "60"}
        in_flight = asyncio.ensure_future(http.post(url + "/v1/completions", json=slow, headers=headers))
        await until(lambda: asyncio.sleep(0, daemon.state.in_flight > 0), "the request to start")
        pause(pg_server, mode)
        try:
            await until(lambda: store_unready(http, url), "/readyz to say store_unavailable", timeout_s=20)
            async with http.post(url + "/v1/completions", json=BODY, headers=headers) as resp:
                await assert_store_unavailable(resp)            # refused at once, not held
            async with await in_flight as resp:                 # its row cannot be recorded: withheld
                await assert_store_unavailable(resp)
        finally:
            resume(pg_server, mode)
        await until(lambda: ready(http, url), "/readyz to be 200 again", timeout_s=30)
        async with http.post(url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 200, await resp.text()


async def test_a_sqlite_file_that_cannot_grow_is_unready_until_it_has_room(tmp_path):
    config = load_config(write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)},
                                      "[store]\nunavailable_retry_s = 0.3\n" + PROBES))
    async with running_daemon(config) as (daemon, _, url), aiohttp.ClientSession() as http:
        store = daemon.state.store
        [(pages,)] = await store.query("PRAGMA page_count")
        await store.execute(f"PRAGMA max_page_count = {pages}")     # the file cannot grow: SQLITE_FULL
        for _ in range(500):                                        # until a ledger row does not fit
            async with http.post(url + "/v1/completions", json=BODY) as resp:
                if resp.status != 200:
                    await assert_store_unavailable(resp)
                    break
        assert resp.status == 503, "the file never filled"
        assert await store_unready(http, url)                       # marked by the failed commit at once
        await until(lambda: store_unready(http, url), "/readyz to stay unready while the file is full")
        await store.execute("PRAGMA max_page_count = 1073741823")   # room again: the next ping sees it
        await until(lambda: ready(http, url), "/readyz to be 200 again")
        async with http.post(url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 200, await resp.text()


async def test_a_ledger_commit_that_times_out_is_withheld_uncommitted_and_readyz_stays_200(
        tmp_path, pg_server, pg_dsn):  # noqa: F811
    import psycopg

    config = load_config(write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.0)},
                                      f'[store]\nbackend = "postgres"\ndsn = "{pg_dsn}"\n{PROBES}'))
    async with running_daemon(config) as (daemon, _, url), aiohttp.ClientSession() as http:
        locker = await psycopg.AsyncConnection.connect(pg_dsn)
        try:
            await locker.execute("LOCK TABLE ledger IN EXCLUSIVE MODE")     # a commit slower than timeout_s
            async with http.post(url + "/v1/completions", json=BODY) as resp:
                await assert_store_unavailable(resp)                        # its row timed out: withheld
            assert await ready(http, url)           # a slow commit is no outage: the ping still answers
            assert daemon.state.ledger.unavailable_for() == 0
        finally:
            await locker.rollback()
            await locker.close()
        async with http.post(url + "/v1/completions", json=BODY) as resp:
            assert resp.status == 200, await resp.text()
        # The withheld response's row was rolled back, not committed once the lock went.
        assert await daemon.state.store.query("SELECT COUNT(*) FROM ledger WHERE status = 200") == [(1,)]
