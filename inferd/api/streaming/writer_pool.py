"""The app's SSE writer processes (inferd.api.streaming.writers): started with the app, spread over in turn,
replaced with a backoff when one dies; once per loop turn the handed-over streams with new output are read and
each link's STEP sent."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import sys
from collections.abc import AsyncIterator

from aiohttp import web

from inferd.api.streaming import writer_wire as wire
from inferd.api.streaming.inflight import Flusher
from inferd.api.streaming.writers import FrameTimesSink, WriterDown, WriterLink, child_env
from inferd.observability import get_logger

log = get_logger("inferd.api.streaming.writers")
# A writer that dies is replaced after RESTART_FIRST_S, doubling for each restart in a row (up to RESTART_MAX_S);
# one that lived RESTART_RESET_S starts the count again; past MAX_RESTARTS in a row its slot stays empty.
RESTART_FIRST_S, RESTART_MAX_S, RESTART_RESET_S, MAX_RESTARTS = 0.1, 5.0, 60.0, 8
READY_WITHIN_S = 10.0        # a writer not READY by then serves anyway (its streams wait for it, as before)


class WriterPool:
    """The app's writer processes; streams are spread over them in turn."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.links: list[WriterLink] = []
        self._next = itertools.cycle(range(max(count, 1)))
        self._sids = itertools.count(1)
        self._due: list[WriterLink] = []               # links with a STEP gathered this turn
        # Handed-over streams with new output: read, and their text added to their link's STEP, in the turn that
        # sends the STEPs. The app's Flusher (in-process streams) would read them a loop turn before that one.
        self.reads = Flusher(after=self._send_steps)
        self.handed = 0                 # streams handed over so far
        self.kept = 0                   # streams whose handover failed, written in this process instead
        self._stopping = False
        self._series: dict[int, tuple[int, FrameTimesSink]] = {}   # id(series) -> (its number, it)
        self._numbered: list[FrameTimesSink] = []                     # by number: what writers' DELAYS name
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
                pass_fds=(theirs.fileno(),), env=child_env())
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

    def series_number(self, series: FrameTimesSink) -> int:
        """The number writers' DELAYS name `series` by (a stream's metric labels: one per model version). The
        series are kept: there are as many as versions ever served."""
        known = self._series.get(id(series))
        if known is None:
            known = self._series[id(series)] = (len(self._numbered), series)
            self._numbered.append(series)
        return known[0]

    def add_frame_times(self, delays: list, itls: list) -> None:
        """A writer's DELAYS: write delays and inter-token latencies, each [[series number, counts per bucket, sum],
        ...], into each series' histograms."""
        numbered = self._numbered
        for number, counts, total in delays:
            if 0 <= number < len(numbered):
                numbered[number].add_write_delays(counts, total)
        for number, counts, total in itls:
            if 0 <= number < len(numbered):
                numbered[number].add_itls(counts, total)

    def schedule(self, link: WriterLink) -> None:
        self._due.append(link)
        self.reads.wake()

    def _send_steps(self) -> None:
        due, self._due = self._due, []
        for link in due:
            try:
                link._flush_step()
            except WriterDown:          # its streams were told (GONE)
                pass
            except Exception:           # a bug: logged, and the other links' STEPs still go
                log.exception("writer_step_not_sent", pid=link.process.pid)
