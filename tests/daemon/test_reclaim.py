"""A daemon killed with SIGKILL and started again on the same state directory releases what the dead
process held: a retry with the same Idempotency-Key runs at once (not 409 until the claim's hold lapses),
and a batch it was running is released to the new process (not left until its lease expires). A live
daemon's claims are left alone, in this PID namespace or another (a container on the same host)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import functools
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.daemon.harness import sim_model, write_config
from tests.pg_server import pg_dsn, pg_server  # noqa: F401  (fixtures: a throwaway PostgreSQL server)


class DaemonProcess:
    """`python -m inferd serve` on an ephemeral port; its JSON log read as it comes (so the pipe never fills)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc, self.log, self.url = proc, [], ""
        self._ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while raw := await self.proc.stderr.readline():
            with contextlib.suppress(ValueError):
                line = orjson.loads(raw)
                self.log.append(line)
                if line.get("event") == "listening":
                    self.url = f"http://127.0.0.1:{line['port']}"
                elif line.get("event") == "ready" and not self._ready.done():
                    self._ready.set_result(None)
        if not self._ready.done():
            self._ready.set_exception(AssertionError(f"the daemon exited before it was ready; its log: {self.log}"))

    async def ready(self) -> None:
        await asyncio.wait_for(asyncio.shield(self._ready), 120)

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
        await self._reader


@contextlib.asynccontextmanager
async def daemon(config: Path, *, wrapper: tuple[str, ...] = ()) -> AsyncIterator[DaemonProcess]:
    """A daemon serving `config`, run by `wrapper` (a command that runs its arguments) if given."""
    proc = await asyncio.create_subprocess_exec(
        *wrapper, sys.executable, "-m", "inferd", "serve", "--config", str(config), "--port", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    running = DaemonProcess(proc)
    try:
        await running.ready()
        yield running
    finally:
        await running.kill()


def config(tmp_path: Path, time_scale: float, dsn: str | None = None, name: str = "inferd") -> Path:
    # tiny sim profile: ~2.5 ms a token at time_scale 1
    store = f'[store]\nbackend = "postgres"\ndsn = "{dsn}"\n' if dsn else ""
    (tmp_path / name).mkdir()
    return write_config(tmp_path / name / "inferd.toml", {"sim": sim_model(time_scale=time_scale)}, store)


BODY = {"model": "sim", "prompt": "hi", "max_tokens": 400, "ignore_eos": True, "stream": True}
KEY = {"Idempotency-Key": "order-42"}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_retry_after_a_crash_and_restart_runs_at_once_instead_of_409(tmp_path, backend, request):
    dsn = request.getfixturevalue("pg_dsn") if backend == "postgres" else None
    path = config(tmp_path, time_scale=10.0, dsn=dsn)       # ~25 ms a token: the first attempt runs ~10 s
    body, headers = BODY, KEY
    async with aiohttp.ClientSession() as http:
        async with daemon(path) as first:
            async with http.post(f"{first.url}/v1/completions", json=body, headers=headers) as resp:
                assert resp.status == 200
                assert (await resp.content.readline()).startswith(b"data: ")      # claimed and running
                async with http.post(f"{first.url}/v1/completions", json=body, headers=headers) as again:
                    assert again.status == 409           # in flight on the live daemon, as the draft says
                await first.kill()
        async with daemon(path) as second:
            async with http.post(f"{second.url}/v1/completions", json=body, headers=headers) as retry:
                assert retry.status == 200, await retry.text()
                assert "Idempotent-Replayed" not in retry.headers
                assert (await retry.content.readline()).startswith(b"data: ")
    [released] = [line for line in second.log if line.get("event") == "released_dead_claims"]
    assert released["idempotency_claims"] == 1


# A new user and PID namespace with its own /proc: the daemon runs there as pid 1, as in a container.
OTHER_PID_NAMESPACE = ("unshare", "--user", "--map-root-user", "--pid", "--mount-proc", "--kill-child")


@functools.cache
def can_unshare() -> bool:
    try:
        return subprocess.run([*OTHER_PID_NAMESPACE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.parametrize("namespace", ["same", "other"])
async def test_a_daemon_starting_beside_a_live_one_on_the_same_host_leaves_its_claims(tmp_path, pg_dsn, namespace):  # noqa: F811
    """Two daemons on one host share PostgreSQL under one node name (the host's): the second's start
    finds the first's claim, whose process still runs, and leaves it; also when the first runs in
    another PID namespace, where its pid names another process here, or none."""
    if namespace == "other" and not can_unshare():
        pytest.skip("cannot make a user and PID namespace here (unshare)")
    wrapper = OTHER_PID_NAMESPACE if namespace == "other" else ()
    async with aiohttp.ClientSession() as http, daemon(config(tmp_path, 10.0, pg_dsn, "a"), wrapper=wrapper) as first:
        async with http.post(f"{first.url}/v1/completions", json=BODY, headers=KEY) as resp:
            assert (await resp.content.readline()).startswith(b"data: ")          # claimed and running
            async with daemon(config(tmp_path, 10.0, pg_dsn, "b")) as second:
                async with http.post(f"{second.url}/v1/completions", json=BODY, headers=KEY) as again:
                    assert again.status == 409
    assert not [line for line in second.log if line.get("event") == "released_dead_claims"]


async def batch_of(http: aiohttp.ClientSession, url: str, lines: int) -> str:
    text = "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                               "body": {"model": "sim", "prompt": "hi", "max_tokens": 100, "ignore_eos": True}}) + "\n"
                   for i in range(lines))
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", text.encode(), filename="in.jsonl", content_type="application/jsonl")
    async with http.post(f"{url}/v1/files", data=form) as resp:
        assert resp.status == 200, await resp.text()
        file_id = (await resp.json())["id"]
    made = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    async with http.post(f"{url}/v1/batches", json=made) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["id"]


async def batch(http: aiohttp.ClientSession, url: str, batch_id: str) -> dict:
    async with http.get(f"{url}/v1/batches/{batch_id}") as resp:
        assert resp.status == 200
        return await resp.json()


async def until(condition, what: str, timeout_s: float) -> float:
    """Poll `condition` every 50 ms; the seconds it took; fail naming `what` after `timeout_s`."""
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def lease_owner(path: Path, batch_id: str) -> str:
    """The batch's lease owner as `inferd batches show` reports it."""
    shown = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferd", "batches", "show", "--config", str(path), batch_id,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(shown.communicate(), 120)
    assert shown.returncode == 0, err.decode()
    return json.loads(out)["lease_owner"]


def pid_of(owner: str) -> int:
    return int(owner.split("/")[1])


async def test_a_batch_of_a_crashed_daemon_is_released_to_the_restarted_one_which_completes_it(tmp_path):
    path = config(tmp_path, time_scale=4.0)        # ~1 s a line, 8 at a time: 24 lines take ~3 s, the kill
    # comes after the first 8 with two waves to spare
    async with aiohttp.ClientSession() as http:
        async with daemon(path) as first:
            batch_id = await batch_of(http, first.url, 24)

            async def some_done() -> bool:
                return (await batch(http, first.url, batch_id))["request_counts"]["completed"] >= 4
            await until(some_done, "the first lines of the batch", 120)         # a hang guard
            await first.kill()
        assert pid_of(await lease_owner(path, batch_id)) == first.proc.pid          # the dead process's lease
        async with daemon(path) as second:
            resumed = (await batch(http, second.url, batch_id))["request_counts"]["completed"]
            assert resumed < 24

            async def completed() -> bool:
                return (await batch(http, second.url, batch_id))["status"] == "completed"
            await until(completed, "the batch completed", 300)                  # a hang guard
            assert (await batch(http, second.url, batch_id))["request_counts"] == {
                "total": 24, "completed": 24, "failed": 0}
    [released] = [line for line in second.log if line.get("event") == "released_dead_claims"]
    assert released["batch_leases"] == 1
    # The batch is ended only by the process holding its lease (BatchStore.finish checks it): the new one.
    [ended] = [line for line in second.log if line.get("event") == "batch_ended" and line.get("batch") == batch_id]
    assert (ended["status"], ended["completed"]) == ("completed", 24)
