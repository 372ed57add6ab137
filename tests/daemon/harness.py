"""A real Daemon (real app, sim engines) on an ephemeral loopback port, driven from a TOML file,
for the issue-5 tests: versions, aliases, rollouts, reload, shadow, sd_notify."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from inferd.config.root import Config, load_config
from inferd.daemon.lifecycle import Daemon


def sim_model(versions: list[str] | None = None, *, time_scale: float = 0.01, version: str = "latest",
              max_batch_size: int = 8, num_kv_blocks: int = 256) -> str:
    """The body of a [models.<name>] table serving the tiny sim profile."""
    lines = ['backend = "sim"', f'version = "{version}"', f"max_batch_size = {max_batch_size}",
             "max_num_tokens = 256", f"num_kv_blocks = {num_kv_blocks}"]
    if versions:
        lines.append("versions = [" + ", ".join(f'"{v}"' for v in versions) + "]")
    return "\n".join(lines) + f'\n[MODEL.sim]\nprofile = "tiny"\ntime_scale = {time_scale}\nmax_model_len = 2048\n'


def write_config(path: Path, models: dict[str, str], extra: str = "", *, drain_grace_s: float = 10.0) -> Path:
    text = f'[server]\nport = 0\ndrain_grace_s = {drain_grace_s}\n[audit]\npath = "audit.jsonl"\n'
    for name, body in models.items():
        text += f"[models.{name}]\n" + body.replace("[MODEL.", f"[models.{name}.")
    path.write_text(text + extra)
    return path


@contextlib.asynccontextmanager
async def running_daemon(config: Config, *, drain: bool = False,
                         **daemon_kw) -> AsyncIterator[tuple[Daemon, asyncio.Task[int], str]]:
    """A Daemon serving `config`, yielded once ready (the test fails if it exits during startup) with
    its run task and base URL. On exit a daemon still running is stopped: after draining when `drain`
    (and only if nobody asked it to stop yet), else at once; the exit code is left in the task."""
    daemon = Daemon(config, **daemon_kw)
    task = asyncio.ensure_future(daemon.run())
    ready = asyncio.ensure_future(daemon.ready.wait())
    await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        ready.cancel()
        pytest.fail(f"daemon exited during startup with {task.result()}")
    try:
        yield daemon, task, f"http://127.0.0.1:{daemon.port}"
    finally:
        if not task.done():
            if not drain:
                daemon.request_stop()
                daemon.request_stop()
            elif not daemon.stopping:
                daemon.request_stop()
        await task


@contextlib.asynccontextmanager
async def running(config_path: Path, **daemon_kw) -> AsyncIterator[tuple[Daemon, str]]:
    async with running_daemon(load_config(config_path), config_path=config_path, **daemon_kw) as (daemon, _, url):
        yield daemon, url


async def until(condition, what: str, timeout_s: float = 5.0) -> None:
    """Poll the async `condition` every 20 ms until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


async def complete(http: aiohttp.ClientSession, url: str, model: str, *, max_tokens: int = 4,
                   user: str | None = None) -> tuple[int, dict, dict]:
    body: dict = {"model": model, "prompt": "hello", "max_tokens": max_tokens}
    if user is not None:
        body["user"] = user
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def stream(http: aiohttp.ClientSession, url: str, model: str, max_tokens: int,
                 started: asyncio.Event | None = None) -> tuple[int, str | None, int, str]:
    """Stream a completion; returns (status, finish_reason, chunks, served model@version)."""
    body = {"model": model, "prompt": "hello", "max_tokens": max_tokens, "stream": True}
    finish, chunks, served = None, 0, ""
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            chunks += 1
            served = chunk.get("model", served)
            if started is not None:
                started.set()
            for choice in chunk.get("choices", ()):
                finish = choice.get("finish_reason") or finish
        return resp.status, finish, chunks, served


@contextlib.asynccontextmanager
async def cluster_daemons(tmp_path: Path, n: int, node_config: Callable[[int, str], str], *, key: str,
                          slots: int = 1) -> AsyncIterator[list[tuple[Daemon, str]]]:
    """n in-process daemons, each in tmp_path/node<i> with its own cluster.key (`key`) and a sim model of
    `slots` sequence slots; `node_config(i, seeds)` is node i's [cluster] table and any other config
    (seeds: the first node's gossip address, "" for the first itself). Yields [(daemon, base_url)]."""
    nodes: list[tuple[Daemon, str]] = []
    async with contextlib.AsyncExitStack() as stack:
        seeds = ""
        for i in range(n):
            d = tmp_path / f"node{i}"
            d.mkdir()
            (d / "cluster.key").write_text(key)
            path = write_config(d / "inferd.toml", {"sim": sim_model(time_scale=1.0, max_batch_size=slots)},
                                node_config(i, seeds))
            daemon, _, url = await stack.enter_async_context(running_daemon(load_config(path)))
            nodes.append((daemon, url))
            if i == 0:
                host, port = daemon.state.cluster.gossip.address
                seeds = f'"{host}:{port}"'
        yield nodes
