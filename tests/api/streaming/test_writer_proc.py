"""The writer process (inferd.api.streaming.writer_proc) on its wire, driven as the main process would: what it
counts and reports, that no report is lost while the main process is not reading, and what it does at end-of-file."""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import signal
import socket
import struct
import sys
import termios
import time
from collections.abc import AsyncIterator

import pytest

from inferd.api.streaming import writer_wire as wire
from inferd.api.streaming.writer_client import ITL_BOUNDS, WRITE_DELAY_BOUNDS
from inferd.api.streaming.writers import child_env
from inferd.api.streaming.accepted import _bytes_acked as bytes_acked
from tests.api.streaming.test_accepted import int_ioctl, loopback_pair
from tests.daemon.harness import until


class Main:
    """The main process's end of one writer: its socket, and the writer process."""

    def __init__(self, sock: socket.socket, process: asyncio.subprocess.Process) -> None:
        self.sock, self.process = sock, process
        self.clients: dict[int, socket.socket] = {}     # the client's end of each stream, by sid
        self.servers: dict[int, socket.socket] = {}     # a copy of the writer's end, of a TCP stream

    async def send(self, message: list) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, wire.encode(message))

    def open(self, sid: int, include_usage: bool = False, *, tcp: bool = False) -> socket.socket:
        client, server = loopback_pair() if tcp else socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socket.send_fds(self.sock, [wire.encode([wire.OPEN, sid, True, "completion", "cmpl-1", 1, "sim", "fp",
                                                 include_usage, None, 0])], [server.fileno()])
        if tcp:
            self.servers[sid] = server          # kept, to read what the connection acknowledged
        else:
            server.close()
        client.setblocking(False)
        self.clients[sid] = client
        return client

    async def report(self, timeout_s: float = 10.0) -> list:
        data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, wire.MAX_MESSAGE), timeout_s)
        assert data, "the writer closed its socket"
        return wire.decode(data)

    async def report_of(self, kind: str) -> list:
        while (msg := await self.report())[0] != kind:
            pass
        return msg

    async def synced(self) -> None:
        """Once the writer has handled every message sent so far (an ACK of no stream is answered at once)."""
        await self.send([wire.ACK, 0, 0.0])
        assert await self.report_of(wire.ACKED) == [wire.ACKED, 0, 0, False]

    async def flood(self, sid: int, nbytes: int, tokens: int) -> None:
        """`nbytes` of text in STEPs the size the main process sends, its tokens on the last."""
        piece = wire.TEXT_PIECE
        for at in range(0, nbytes, piece):
            await self.send([wire.STEP, [[sid, "x" * min(piece, nbytes - at), tokens if at + piece >= nbytes else 0, None]]])

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))


@contextlib.asynccontextmanager
async def writer_process(sndbuf: int | None = None) -> AsyncIterator[Main]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if sndbuf is not None:
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferd.api.streaming.writer_proc", str(theirs.fileno()),
        pass_fds=(theirs.fileno(),), env=child_env())
    theirs.close()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, wire.SOCKET_BUFFER)
    ours.setblocking(False)
    main = Main(ours, process)
    try:
        yield main
    finally:
        ours.close()
        for client in [*main.clients.values(), *main.servers.values()]:
            client.close()
        with contextlib.suppress(ProcessLookupError):
            await asyncio.wait_for(process.wait(), 10)


def whole_chunks(data: bytes) -> list[bytes]:
    """The HTTP chunks wholly within `data`, from its start."""
    chunks = []
    while True:
        size, sep, rest = data.partition(b"\r\n")
        if not sep or len(rest) < int(size, 16) + 2:
            return chunks
        chunks.append(rest[:int(size, 16)])
        data = rest[int(size, 16) + 2:]


async def read_all(client: socket.socket) -> bytes:
    got, loop = b"", asyncio.get_running_loop()
    while data := await asyncio.wait_for(loop.sock_recv(client, 1 << 16), 10):
        got += data
    return got


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts the writer's fds in /proc")
async def test_every_gone_reaches_the_main_process_even_while_it_is_not_reading():
    async with writer_process(sndbuf=1) as main:
        await main.synced()
        baseline = main.open_fds()
        streams = 40                    # several times what the socket pair holds unread (net.unix.max_dgram_qlen)
        for sid in range(1, streams + 1):
            main.open(sid)
        await main.synced()
        assert main.open_fds() == baseline + streams
        for client in main.clients.values():
            client.close()              # every client leaves while the main process reads nothing

        async def dropped() -> bool:    # the writer closes a client's socket just before reporting GONE
            return main.open_fds() == baseline
        await until(dropped, "the writer to see every client leave")
        gone = set()
        while len(gone) < streams:
            msg = await main.report()
            if msg[0] == wire.GONE:
                gone.add(msg[1])
        assert gone == set(range(1, streams + 1))
        main.clients.clear()


async def test_on_end_of_file_from_the_main_process_what_is_queued_is_written_out():
    async with writer_process() as main:
        client = main.open(1)
        frame = b"data: " + b"x" * (4 << 20) + b"\n\n"     # far more than the client's socket holds
        for at in range(0, len(frame), 1 << 16):
            await main.send([wire.RAW, 1, frame[at:at + (1 << 16)].decode(), 0])
        await main.send([wire.CLOSE, 1])
        main.sock.shutdown(socket.SHUT_RDWR)                # the main process is gone
        got = await read_all(client)
        # the body's end is the main process's to write, once the socket is back: the last chunk, whole
        assert got.count(b"x") == 4 << 20 and got.endswith(b"x\n\n\r\n"), (len(got), got[-30:])


async def test_a_client_that_leaves_is_reported_with_the_tokens_its_socket_acknowledged():
    async with writer_process() as main:
        client = main.open(1)
        await main.send([wire.STEP, [[1, "hello", 3, None]]])
        loop = asyncio.get_running_loop()
        assert b"hello" in await loop.sock_recv(client, 4096)
        assert await main.report_of(wire.TOOK) == [wire.TOOK, [[1, 3]]]     # sampled a few times a second
        await main.flood(1, 1 << 20, 5)                                           # never read: not acknowledged
        client.close()
        assert await main.report_of(wire.GONE) == [wire.GONE, 1, 3]
        main.clients.clear()


async def test_a_tcp_client_that_resets_is_reported_with_exactly_the_tokens_it_acknowledged():
    async with writer_process() as main:
        client = main.open(1, tcp=True)
        before_frames = bytes_acked(main.servers[1])    # the handshake's, on some kernels
        for _ in range(150):                    # a frame (about 1 KB) and a token each: more than its window
            await main.send([wire.STEP, [[1, "x" * 1000, 1, None]]])
            await main.synced()                 # read alone: its own frame, mostly
        held = [-1]

        async def acknowledged_all_it_holds() -> bool:  # its window full, and its delayed ACKs sent
            before, held[0] = held[0], int_ioctl(client, termios.FIONREAD)
            return held[0] == before == bytes_acked(main.servers[1]) - before_frames > 0
        await until(acknowledged_all_it_holds, "the client's window to fill and be acknowledged")
        tokens = sum(chunk.count(b"x") for chunk in whole_chunks(client.recv(held[0], socket.MSG_PEEK))) // 1000
        assert 0 < tokens < 150
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()                          # a reset: the writer's send queue is dropped, TCP_INFO's count is not
        main.clients.clear()
        assert await main.report_of(wire.GONE) == [wire.GONE, 1, tokens]


async def test_ack_is_answered_once_the_client_took_everything_before_the_final_frames():
    async with writer_process() as main:
        client = main.open(1)
        await main.send([wire.STEP, [[1, "hello", 3, None]]])
        await main.send([wire.RAW, 1, 'data: {"final": true}\n\n', 4])
        await main.send([wire.ACK, 1, 5.0])
        loop = asyncio.get_running_loop()
        got = b""
        while b"final" not in got:
            got += await loop.sock_recv(client, 4096)
        assert await main.report_of(wire.ACKED) == [wire.ACKED, 1, 4, True]


async def test_ack_of_a_client_that_stopped_reading_answers_not_acknowledged_after_its_bound():
    async with writer_process() as main:
        main.open(1)
        await main.flood(1, 1 << 20, 3)                               # more than its socket takes: never acknowledged
        await main.send([wire.RAW, 1, 'data: {"final": true}\n\n', 4])
        await main.send([wire.ACK, 1, 0.2])
        assert await main.report_of(wire.ACKED) == [wire.ACKED, 1, 0, False]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts the writer's fds in /proc")
async def test_a_closed_stream_whose_client_stopped_reading_is_dropped_after_its_grace():
    async with writer_process() as main:
        await main.synced()
        before = main.open_fds()
        client = main.open(1)
        for _ in range(64):                                 # far more than the client's socket holds
            await main.send([wire.RAW, 1, "data: " + "x" * (1 << 16) + "\n\n", 0])
        await main.send([wire.CLOSE, 1, 0.2])
        await main.synced()
        assert main.open_fds() == before + 1                # still trying to write the rest
        async def dropped() -> bool:
            return main.open_fds() == before
        await until(dropped, "the connection dropped after its grace")
        assert await main.report_of(wire.RETURNED) == [wire.RETURNED, 1, 0, False]     # not handed back: cut
        client.setblocking(True)
        client.settimeout(10)
        while client.recv(1 << 16):                         # the client sees the connection end, cut short
            pass


async def test_a_final_frame_larger_than_a_message_can_be_goes_in_pieces_and_the_socket_is_handed_back_after_it():
    frame = "data: " + "y" * (3 << 20) + "\n\n"            # text merged while its client was blocked
    pieces = wire.text_pieces(frame)
    assert "".join(pieces) == frame
    assert max(len(wire.encode([wire.RAW, 1, piece, 10**6])) for piece in pieces) <= wire.SPLIT_AT
    async with writer_process() as main:
        client = main.open(1)
        for piece in pieces:
            await main.send([wire.RAW, 1, piece, 0])
        reading = asyncio.ensure_future(read_all(client))   # to the end: the writer's copy of the socket is the last
        await main.send([wire.CLOSE, 1])
        assert await main.report_of(wire.RETURNED) == [wire.RETURNED, 1, 0, True]
        got = await reading
    assert got.count(b"y") == 3 << 20 and got.endswith(b"y\n\n\r\n")


async def test_the_write_delay_from_the_engines_push_to_the_socket_is_reported_per_series():
    async with writer_process() as main:
        client = main.open(1)
        await main.synced()
        pushed = time.monotonic() - 0.3             # the engine pushed it 0.3 s before the writer got it
        await main.send([wire.STEP, [[1, "hello", 2, pushed]]])
        assert b"hello" in await asyncio.get_running_loop().sock_recv(client, 4096)
        _, [[series, counts, total]], itls = await main.report_of(wire.DELAYS)
        assert series == 0 and sum(counts) == 1 and 0.3 <= total < 10, (counts, total)
        assert counts[bisect.bisect_left(WRITE_DELAY_BOUNDS, total)] == 1, (counts, total)   # its bucket, as Prometheus'
        assert itls == []           # a stream's first frame: its latency is the main process's TTFT


async def test_the_inter_token_latency_between_a_streams_frames_is_observed_as_its_socket_takes_them():
    async with writer_process() as main:
        client = main.open(1)
        await main.synced()
        loop = asyncio.get_running_loop()
        sent_first = time.monotonic()
        await main.send([wire.STEP, [[1, "one", 1, None]]])      # its first frame: the main process's TTFT
        assert b"one" in await loop.sock_recv(client, 4096)
        await asyncio.sleep(0.2)
        sent_second = time.monotonic()
        await main.send([wire.STEP, [[1, "two", 2, None]]])      # two tokens in its second frame
        assert b"two" in await loop.sock_recv(client, 4096)
        await main.send([wire.RAW, 1, "data: {}\n\n", 4])        # the final chunk: one token more (3 read, now 4)
        await loop.sock_recv(client, 4096)
        counts, total = [0] * len(ITL_BOUNDS), 0.0
        while sum(counts) < 2:                                  # the samples' reports, a few a second
            for series, got, seconds in (await main.report_of(wire.DELAYS))[2]:
                assert series == 0 and len(got) == len(ITL_BOUNDS)
                counts = [a + b for a, b in zip(counts, got)]
                total += seconds
        assert sum(counts) == 2, counts             # the second frame (its gap over 2 tokens) and the final one
        assert 0.2 / 2 <= total <= (time.monotonic() - sent_first) / 2 + (time.monotonic() - sent_second), total


async def test_steps_that_waited_for_the_writer_go_out_as_one_frame_per_stream():
    # A writer behind by several engine steps catches up: one send() per stream, not one per step.
    async with writer_process() as main:
        clients = {sid: main.open(sid) for sid in (1, 2)}
        await main.synced()
        os.kill(main.process.pid, signal.SIGSTOP)     # it falls behind: three steps wait on its socket
        try:
            for word in ("one", "two", "six"):
                await main.send([wire.STEP, [[1, word, 1, None], [2, word.upper(), 1, None]]])
        finally:
            os.kill(main.process.pid, signal.SIGCONT)
        await main.synced()
        await main.synced()                         # the read that took the steps has written them
        loop = asyncio.get_running_loop()
        for sid, text in ((1, b"onetwosix"), (2, b"ONETWOSIX")):
            got = await loop.sock_recv(clients[sid], 1 << 16)
            assert got.count(b"data: ") == 1 and text in got, got
