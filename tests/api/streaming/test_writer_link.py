"""The main process's link to one writer process (inferd.api.streaming.writers.WriterLink): what waits while the
writer's socket is full is bounded in messages and in bytes; past either the writer counts as gone."""
from __future__ import annotations

import socket

import pytest

from inferd.api.streaming import writers
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
