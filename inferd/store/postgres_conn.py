"""How inferd talks to PostgreSQL: its `?` SQL in psycopg's placeholders, its DSN without the password
(for messages), and connections made so that a server that stops answering is noticed: libpq's connect timeout, TCP keepalives and TCP_USER_TIMEOUT (a partitioned server sends no RST; without
these a socket waits for the kernel's retransmissions, minutes), a server-side statement_timeout on every
pooled connection, the NUMERIC loader, and the health ping's own connection (outside the pool, so a
pool busy with slow requests does not read as a dead server).
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.adapt import Loader

from inferd.store.db import StoreUnavailable


@lru_cache(maxsize=512)
def to_pyformat(sql: str) -> str:
    """`?` -> `%s` outside quotes and comments, every `%` -> `%%` (psycopg reads `%` everywhere)."""
    out: list[str] = []
    quote = ""
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "%":
            out.append("%%")
        elif quote:
            out.append(c)
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            out.append(c)
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(sql[i:end].replace("%", "%%"))
            i = end
            continue
        elif c == "?":
            out.append("%s")
        else:
            out.append(c)
        i += 1
    return "".join(out)


_KV_PASSWORD = re.compile(r"\s*\bpassword\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)


def redact(dsn: str) -> str:
    """The DSN without its password (URL userinfo, `password=` query parameter or key/value pair)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hosts = netloc.rpartition("@")
            netloc = f"{userinfo.split(':', 1)[0]}@{hosts}"
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"])
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    return _KV_PASSWORD.sub("", dsn).strip()


def connection_kwargs(timeout_s: float) -> dict[str, Any]:
    """libpq parameters bounding connects and detecting a dead peer within about `timeout_s`."""
    return {"connect_timeout": max(2, math.ceil(timeout_s)),    # libpq's minimum is 2 s
            "keepalives": 1, "keepalives_idle": max(1, math.ceil(timeout_s / 2)), "keepalives_interval": 1,
            "keepalives_count": 3, "tcp_user_timeout": max(1000, int(timeout_s * 1000))}


class _NumericLoader(Loader):
    """NUMERIC as int when integral, else float: what SQLite gives for the same SUM/AVG."""

    def load(self, data: Any) -> int | float:
        text = bytes(data).decode()
        try:
            return int(text)
        except ValueError:
            return float(text)


def configurer(timeout_s: float):
    """The pool's `configure`: the loader, and statement_timeout so the server ends a statement (a lock
    wait included) that outlives the client's own timeout."""
    async def configure(conn: psycopg.AsyncConnection) -> None:
        conn.adapters.register_loader("numeric", _NumericLoader)
        await conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{int(timeout_s * 1000)}ms",))
        await conn.commit()
    return configure


class Pinger:
    """`SELECT 1` on a connection of its own, kept between pings and made again after a failure."""

    def __init__(self, dsn: str, where: str, timeout_s: float, message: Callable[[BaseException], str]) -> None:
        self._dsn, self._where, self._timeout_s, self._message = dsn, where, timeout_s, message
        self._conn: psycopg.AsyncConnection | None = None
        self._tasks: set[asyncio.Task] = set()      # pings given up on, still unwinding (psycopg's cancel)

    async def ping(self, timeout: float) -> None:
        task = asyncio.ensure_future(self._ping())
        self._tasks.add(task)
        task.add_done_callback(self._done)
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            task.cancel()           # it closes its connection as it unwinds; the next ping connects afresh
            self._conn = None
            raise StoreUnavailable(f"PostgreSQL at {self._where}: no answer to a ping within {timeout:g} s") from None

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()

    async def _ping(self) -> None:
        conn = self._conn
        try:
            if conn is None or conn.closed:
                conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True,
                                                             **connection_kwargs(self._timeout_s))
                self._conn = conn
            await conn.execute("SELECT 1")
        except BaseException as e:
            if self._conn is conn:
                self._conn = None
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
            if isinstance(e, psycopg.Error):       # the message without the DSN's password
                raise StoreUnavailable(f"PostgreSQL at {self._where}: ping: {self._message(e)}") from None
            raise

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:     # each closes its connection as it unwinds (bounded: a dead server's cancel)
            await asyncio.wait(list(self._tasks), timeout=1.0)
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
