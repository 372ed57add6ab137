"""SSE writer processes, the main process's side: hand a stream's client socket over, then its text.

With `[server] front_processes = N` (N > 0) the app starts N writer processes
(inferd.api.streaming.writer_proc). A plain-TCP chat or text completion stream whose headers this process
writes is handed to one of them once the headers are out: its socket goes over with SCM_RIGHTS and this
process keeps everything else (the engine's RequestStream, admission, quotas, the ledger, the watchdog).
Once per loop turn (an engine step's outputs arrive in one) every writer gets one STEP message with each
of its streams' new text; the stream's final frames, pings and `[DONE]` (after the ledger row) are encoded
here and sent as RAW. Writers report clients that left (GONE: the stream ends as a disconnect does in
process, and its engine request is aborted) and clients behind (BLOCKED/DRAINED: their text merges in the
RequestStream meanwhile). Once the stream is written the writer hands the socket back (RETURNED): this
process ends the response and the connection serves the client's next request here; TLS streams stay in
process.
Billing reads what the writer counted (its reports carry the tokens each client acknowledged). A writer
that dies ends its streams as disconnects (their engine requests aborted) and is replaced after a backoff
(WriterPool.lost); while none is alive, new streams are written in process.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import socket
import sys
from collections.abc import AsyncIterator
from typing import Protocol
from pathlib import Path

from aiohttp import web

import inferd
from inferd.observability import get_logger
from inferd.api.streaming import writer_wire as wire

log = get_logger("inferd.api.streaming.writers")
# A writer that dies is replaced after RESTART_FIRST_S, doubling for each restart in a row (up to RESTART_MAX_S);
# one that lived RESTART_RESET_S starts the count again; past MAX_RESTARTS in a row its slot stays empty.
RESTART_FIRST_S, RESTART_MAX_S, RESTART_RESET_S, MAX_RESTARTS = 0.1, 5.0, 60.0, 8
# Messages, and their bytes, queued for a writer whose socket is full; past either the writer is treated as dead.
# 4096 messages are about 16 turns of a busy writer's traffic; 64 MiB bounds what one slow writer holds here
# (a message is at most SPLIT_AT, and RAW pieces are TEXT_PIECE characters).
MAX_QUEUED, MAX_QUEUED_BYTES = 4096, 64 << 20
READY_WITHIN_S = 10.0        # a writer not READY by then serves anyway (its streams wait for it, as before)


def _child_env() -> dict[str, str]:
    """This environment, with the directory this process's `inferd` came from first on the path."""
    root = str(Path(inferd.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class Reported(Protocol):
    """What a handed-over stream's sender is to its writer link: told what the writer reports."""

    def on_report(self, msg: list) -> None: ...


class WriteDelaySink(Protocol):
    """A stream's metric series, as far as writers' write delays go (inferd.observability.ModelSeries)."""

    def add_write_delays(self, counts: list[int], total: float) -> None: ...


class WriterDown(ConnectionError):
    """A writer process is gone, or so far behind that its queue is full: its streams end as disconnects."""


class WriterLink:
    """One writer process: its socket, the STEP being gathered this turn, and what waits to be sent."""

    def __init__(self, pool: WriterPool, sock: socket.socket, process: asyncio.subprocess.Process) -> None:
        self.pool = pool
        self.sock = sock
        self.process = process
        self.senders: dict[int, Reported] = {}   # each handed-over stream, by sid
        self.step: list[list] = []
        self.step_bytes = 0
        self.queued: collections.deque[tuple[bytes, list[int]]] = collections.deque()
        self.queued_bytes = 0
        self.down = False
        self.started = asyncio.get_running_loop().time()
        self.ready = asyncio.get_running_loop().create_future()   # set by its READY

    def send(self, message: list, fds: list[int] | None = None) -> None:
        if self.step:
            self._flush_step()
        self._send(wire.encode(message), fds or [])

    def add_text(self, sid: int, text: str, tokens: int, pushed_at: float | None = None) -> None:
        step = self.step
        if not step:
            self.pool.schedule(self)
        size = len(text)
        if size <= wire.TEXT_PIECE and self.step_bytes + 4 * size + 48 <= wire.SPLIT_AT:
            step.append([sid, text, tokens, pushed_at])    # the usual: a few tokens' text into this turn's STEP
            self.step_bytes += 4 * size + 48
            return
        *head, last = wire.text_pieces(text)   # a long merged delta: pieces, its tokens on the last
        for piece in head:
            self._add(sid, piece, 0, pushed_at)
        self._add(sid, last, tokens, pushed_at)

    def _add(self, sid: int, text: str, tokens: int, pushed_at: float | None) -> None:
        self.step.append([sid, text, tokens, pushed_at])
        self.step_bytes += 4 * len(text) + 48      # JSON of the worst case (escapes)
        if self.step_bytes > wire.SPLIT_AT:
            self._flush_step()

    def _flush_step(self) -> None:
        step, self.step, self.step_bytes = self.step, [], 0
        if step:
            self._send(wire.encode([wire.STEP, step]), [])

    def _send(self, data: bytes, fds: list[int]) -> None:
        if self.down:
            raise WriterDown("the writer process is gone")
        if not self.queued:
            try:
                socket.send_fds(self.sock, [data], fds) if fds else self.sock.send(data)
                return
            except BlockingIOError:
                asyncio.get_running_loop().add_writer(self.sock.fileno(), self._drain)
            except OSError as exc:
                self._lost()
                raise WriterDown("the writer process is gone") from exc
        if len(self.queued) >= MAX_QUEUED or self.queued_bytes + len(data) > MAX_QUEUED_BYTES:
            self._lost()
            raise WriterDown("the writer process is not keeping up")
        # A queued socket goes as its own duplicate: the stream may end (and its fd be closed and reused
        # for another connection) before the queue drains.
        self.queued.append((data, [os.dup(fd) for fd in fds]))
        self.queued_bytes += len(data)

    def discard_queued(self) -> None:
        """Drop what waits to be sent, closing the duplicated sockets it holds."""
        for _, fds in self.queued:
            for fd in fds:
                os.close(fd)
        self.queued.clear()
        self.queued_bytes = 0

    def _drain(self) -> None:
        while self.queued:
            data, fds = self.queued[0]
            try:
                socket.send_fds(self.sock, [data], fds) if fds else self.sock.send(data)
            except BlockingIOError:
                return
            except OSError:
                self._lost()
                return
            self.queued.popleft()
            self.queued_bytes -= len(data)
            for fd in fds:
                os.close(fd)
        asyncio.get_running_loop().remove_writer(self.sock.fileno())

    def read(self) -> None:
        while True:
            try:
                data = self.sock.recv(wire.MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            msg = wire.decode(data)
            if msg[0] == wire.READY:
                if not self.ready.done():
                    self.ready.set_result(None)
                continue
            if msg[0] == wire.DELAYS:
                self.pool.add_write_delays(msg[1])
                continue
            if msg[0] == wire.TOOK:
                senders = self.senders
                for sid, tokens in msg[1]:
                    sender = senders.get(sid)
                    if sender is not None:
                        sender.on_report([wire.TOOK, sid, tokens])
                continue
            sender = self.senders.get(msg[1])
            if sender is not None:
                sender.on_report(msg)

    def _lost(self) -> None:
        if self.down:
            return
        self.down = True
        if not self.ready.done():           # nothing to wait for any more
            self.ready.set_result(None)
        log.error("writer_process_lost", pid=self.process.pid)
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.sock.fileno())
        loop.remove_writer(self.sock.fileno())
        self.discard_queued()
        for sid, sender in list(self.senders.items()):
            sender.on_report([wire.GONE, sid, None])    # billed what the writer last reported
        self.senders.clear()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()         # one not keeping up is alive: it would write to clients no longer its own
        self.pool.lost(self)


class WriterPool:
    """The app's writer processes; streams are spread over them in turn."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.links: list[WriterLink] = []
        self._next = itertools.cycle(range(max(count, 1)))
        self._sids = itertools.count(1)
        self._due: list[WriterLink] = []
        self.handed = 0                 # streams handed over so far
        self.kept = 0                   # streams whose handover failed, written in this process instead
        self._stopping = False
        self._series: dict[int, tuple[int, WriteDelaySink]] = {}   # id(series) -> (its number, it)
        self._numbered: list[WriteDelaySink] = []                     # by number: what writers' DELAYS name
        self._tries: dict[int, int] = {}                # restarts in a row, by slot
        self._restarts: set[asyncio.Task] = set()

    async def cleanup_ctx(self, app: web.Application) -> AsyncIterator[None]:
        for _ in range(self.count):
            self.links.append(await self._start())
        try:
            yield
        finally:
            self._stopping = True
            for task in list(self._restarts):
                task.cancel()
            loop = asyncio.get_running_loop()
            for link in self.links:
                if not link.down:
                    loop.remove_reader(link.sock.fileno())
                    loop.remove_writer(link.sock.fileno())
                link.discard_queued()
                link.sock.close()           # the writer sees end-of-file and exits
            for link in self.links:
                with contextlib.suppress(ProcessLookupError):
                    await link.process.wait()

    async def _start(self) -> WriterLink:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (ours, theirs):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, wire.SOCKET_BUFFER)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "inferd.api.streaming.writer_proc", str(theirs.fileno()),
                pass_fds=(theirs.fileno(),), env=_child_env())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        link = WriterLink(self, ours, process)
        asyncio.get_running_loop().add_reader(ours.fileno(), link.read)
        # A stream handed to a writer still importing would wait for its start (most of a second): the
        # link serves once the writer says READY (or, not saying it in time, once it has had that time).
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(link.ready), READY_WITHIN_S)
        return link

    def lost(self, link: WriterLink) -> None:
        """A writer died (or fell too far behind): start a replacement in its place, after a backoff that
        grows with each restart in a row that did not live RESTART_RESET_S; after MAX_RESTARTS in a row the
        slot stays empty (streams are written in process once no writer is left)."""
        if self._stopping or link not in self.links:
            return
        slot = self.links.index(link)
        self._restart(slot, link, quick=asyncio.get_running_loop().time() - link.started < RESTART_RESET_S)

    def _restart(self, slot: int, link: WriterLink, *, quick: bool) -> None:
        """A replacement for `link` after the backoff; `quick`: it died young (or never started), so it counts
        towards MAX_RESTARTS in a row."""
        tries = self._tries[slot] = self._tries.get(slot, 0) + 1 if quick else 1
        if tries > MAX_RESTARTS:
            log.error("writer_process_not_restarted", slot=slot, restarts=tries - 1)
            return
        delay = min(RESTART_FIRST_S * 2 ** (tries - 1), RESTART_MAX_S)
        task = asyncio.get_running_loop().create_task(self._replace(slot, link, delay))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _replace(self, slot: int, dead: WriterLink, delay: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            await dead.process.wait()
        dead.sock.close()
        await asyncio.sleep(delay)
        try:
            link = await self._start()
        except OSError:
            log.exception("writer_process_start_failed", slot=slot)
            link = None
        if self._stopping:
            if link is not None:
                link.sock.close()
                await link.process.wait()
            return
        if link is None:        # a start that failed counts as a quick death, however long `dead` lived
            self._restart(slot, dead, quick=True)
            return
        self.links[slot] = link
        log.warning("writer_process_restarted", slot=slot, old_pid=dead.process.pid, pid=link.process.pid,
                    restarts=self._tries.get(slot, 1))

    @property
    def available(self) -> bool:
        return any(not link.down for link in self.links)

    def pick(self) -> WriterLink | None:
        for _ in range(len(self.links)):
            link = self.links[next(self._next) % len(self.links)]
            if not link.down:
                return link
        return None

    def new_sid(self) -> int:
        return next(self._sids)

    def series_number(self, series: WriteDelaySink) -> int:
        """The number writers' DELAYS name `series` by (a stream's metric labels: one per model version). The
        series are kept: there are as many as versions ever served."""
        known = self._series.get(id(series))
        if known is None:
            known = self._series[id(series)] = (len(self._numbered), series)
            self._numbered.append(series)
        return known[0]

    def add_write_delays(self, entries: list) -> None:
        """A writer's DELAYS: [[series number, counts per bucket, sum], ...] into each series' histogram."""
        numbered = self._numbered
        for number, counts, total in entries:
            if 0 <= number < len(numbered):
                numbered[number].add_write_delays(counts, total)

    def schedule(self, link: WriterLink) -> None:
        if not self._due:
            asyncio.get_running_loop().call_soon(self._send_steps)
        self._due.append(link)

    def _send_steps(self) -> None:
        due, self._due = self._due, []
        for link in due:
            with contextlib.suppress(WriterDown):       # its streams were told (GONE)
                link._flush_step()
