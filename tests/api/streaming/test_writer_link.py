"""The main process's link to one writer process (inferd.api.streaming.writers.WriterLink): what waits while the
writer's socket is full is bounded in messages and in bytes; past either the writer counts as gone."""
from __future__ import annotations

import asyncio
import socket

import pytest

from inferd.api.streaming import writer_pool, writers
from inferd.api.streaming.writers import WriterDown, WriterLink


class Pool:
    def __init__(self) -> None:
        self.lost_links: list[WriterLink] = []

    def lost(self, link: WriterLink) -> None:
        self.lost_links.append(link)


class Process:
    pid = 0

    def kill(self) -> None:
        self.killed = True


async def test_a_writer_that_does_not_read_is_given_up_once_its_queue_holds_too_many_bytes(monkeypatch):
    monkeypatch.setattr(writers, "MAX_QUEUED_BYTES", 1 << 20)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)    # theirs never reads
    ours.setblocking(False)
    pool, process = Pool(), Process()
    link = WriterLink(pool, ours, process)
    try:
        message = [writers.wire.RAW, 1, "x" * (60 << 10), 0]
        with pytest.raises(WriterDown, match="not keeping up"):
            for _ in range(writers.MAX_QUEUED):
                link.send(message)
                assert link.queued_bytes <= writers.MAX_QUEUED_BYTES
        assert link.down and pool.lost_links == [link] and process.killed
        assert link.queued_bytes == 0 and not link.queued        # what waited is dropped with it
    finally:
        ours.close()
        theirs.close()


class DeadLink:
    def __init__(self, started: float) -> None:
        self.started, self.process, self.sock = started, self, self

    async def wait(self) -> int:
        return 0

    def close(self) -> None:
        pass


async def test_a_writer_slot_whose_replacements_cannot_start_gives_up_though_the_dead_one_lived_long(monkeypatch):
    monkeypatch.setattr(writer_pool, "RESTART_FIRST_S", 0.0)
    pool = writer_pool.WriterPool(1)
    starts = []

    async def failing_start():
        starts.append(1)
        raise OSError("cannot spawn")
    pool._start = failing_start
    loop = asyncio.get_running_loop()
    dead = DeadLink(started=loop.time() - 10 * writer_pool.RESTART_RESET_S)    # it served a long time, then died
    pool.links = [dead]
    pool.lost(dead)

    async def settled() -> None:
        while pool._restarts:                           # each failed start schedules the next, until it gives up
            await asyncio.gather(*pool._restarts)
    await asyncio.wait_for(settled(), 10)               # without a give-up it would restart for ever
    assert len(starts) == writer_pool.MAX_RESTARTS and pool.links == [dead]
