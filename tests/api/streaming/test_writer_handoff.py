"""Handing a stream's socket to a writer process (inferd.api.streaming.handoff_sender): only once the main
process's transport holds nothing unsent, else those bytes (the headers) would reach the client after the writer's;
then its new output goes to the writer in the writer pool's own loop turn."""
from __future__ import annotations

import asyncio
import socket

from inferd.api.streaming import writer_pool
from inferd.api.streaming import writer_wire as wire
from inferd.api.streaming.handoff_sender import HandoffSender
from inferd.api.streaming.inflight import Flusher, Tracked
from inferd.api.streaming.writers import WriterDown, WriterLink
from inferd.api.wire.responses import ChunkEncoder, Identity
from inferd.engine.stream import RequestStream
from inferd.types import Delta, FinishReason
from tests.daemon.harness import until


class Transport:
    def __init__(self, sock: socket.socket, unsent: int) -> None:
        self.sock, self.unsent, self.written = sock, unsent, b""

    def get_extra_info(self, name: str):
        return self.sock if name == "socket" else None

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written += data

    def pause_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Writer:
    def __init__(self, transport: Transport) -> None:
        self.transport, self.protocol, self.chunked = transport, None, True


class Link:
    def __init__(self) -> None:
        self.sent: list[list] = []
        self.senders: dict = {}
        self.down = False

    def send(self, message: list, fds: list[int] | None = None) -> None:
        self.sent.append(message)

    def add_text(self, sid: int, text: str, tokens: int, pushed_at: float | None = None) -> None:
        self.sent.append([wire.STEP, [[sid, text, tokens]]])


class Pool:
    def __init__(self) -> None:
        self.link, self.handed, self.sids = Link(), 0, iter(range(1, 100))

    def pick(self) -> Link:
        return self.link

    def new_sid(self) -> int:
        return next(self.sids)

    def series_number(self, series) -> int:
        return 0


class WriterProcess:
    pid = 0

    def kill(self) -> None:
        pass


class Obs:
    series = None

    def __init__(self) -> None:
        self.observed: list[int] = []          # on_tokens' token counts
        self.last: float | None = None

    def on_tokens(self, tokens: int, *args) -> None:
        self.observed.append(tokens)

    def last_token_at(self, when: float) -> None:
        self.last = when


async def test_the_socket_goes_over_only_once_the_headers_left_the_main_process_and_merged_text_follows():
    a, b = socket.socketpair()
    try:
        transport, pool, stream = Transport(a, unsent=120), Pool(), RequestStream("cmpl-1")
        entry = Tracked(None, stream, None)
        sender = HandoffSender(entry, Writer(transport), ChunkEncoder(Identity("completion", "cmpl-1", 1, "sim", "fp"),
                                                                      False), False, Obs(), pool=pool)
        stream.push(Delta(text="hello", token_ids=[1, 2]))
        sender.flush()
        assert pool.link.sent == [] and not sender.writable()   # the headers still wait: nothing handed over
        transport.unsent = 0                                     # the kernel took them

        async def opened() -> bool:
            return len(pool.link.sent) >= 2
        await until(opened, "the socket to be handed over")
        assert pool.link.sent[0][0] == wire.OPEN and pool.link.sent[1] == [wire.STEP, [[1, "hello", 2]]]
        assert pool.handed == 1 and pool.link.senders == {1: sender}
        sender.end()
        sender.release()
    finally:
        a.close()
        b.close()


def sender_on(sock: socket.socket, obs: Obs | None = None) -> tuple[HandoffSender, Pool, RequestStream]:
    """A completion stream's sender whose transport (over `sock`) holds nothing unsent."""
    pool, stream = Pool(), RequestStream("cmpl-1")
    sender = HandoffSender(Tracked(None, stream, None), Writer(Transport(sock, unsent=0)),
                           ChunkEncoder(Identity("completion", "cmpl-1", 1, "sim", "fp"), False), False,
                           obs or Obs(), pool=pool)
    return sender, pool, stream


async def test_with_nothing_unsent_the_socket_goes_over_at_once():
    a, b = socket.socketpair()
    try:
        sender, pool, _ = sender_on(a)
        assert [m[0] for m in pool.link.sent] == [wire.OPEN] and sender.writable()
    finally:
        a.close()
        b.close()


async def test_a_final_frame_too_large_for_one_message_goes_to_the_writer_in_pieces():
    a, b = socket.socketpair()
    try:
        sender, pool, stream = sender_on(a)
        stream.push(Delta(text="z" * (2 << 20), token_ids=[1] * 1000, finish_reason=FinishReason.LENGTH))
        sender.flush()
        raws = [m for m in pool.link.sent if m[0] == wire.RAW]
        assert len(raws) > 1 and max(len(wire.encode(m)) for m in raws) <= wire.SPLIT_AT
        assert "".join(m[2] for m in raws).count("z") == 2 << 20
    finally:
        a.close()
        b.close()


async def test_a_writer_dying_as_a_drained_streams_final_frames_go_to_it_ends_the_stream_as_a_disconnect():
    # Left unhandled, the error escaped the report, and the stream, its final frames written (closing), was
    # neither ended nor scanned by the watchdog: its handler waited for ever.
    a, b = socket.socketpair()
    try:
        sender, pool, stream = sender_on(a)
        link = pool.link
        sender.on_report([wire.BLOCKED, sender.sid, 0])
        stream.push(Delta(text="bye", token_ids=[1], finish_reason=FinishReason.STOP))
        sent = link.send

        def dying_send(message: list, fds: list[int] | None = None) -> None:
            if message[0] != wire.RAW:
                return sent(message, fds)
            sender.on_report([wire.GONE, sender.sid, None])     # as WriterLink._lost: GONE first, then raise
            raise WriterDown("the writer process is gone")
        link.send = dying_send
        sender.on_report([wire.DRAINED, sender.sid, 0])
        assert sender.done and sender.entry.client_gone
    finally:
        a.close()
        b.close()


async def test_a_handed_over_streams_new_output_is_read_and_sent_to_its_writer_in_one_loop_turn():
    """The pool's own turn reads the stream and sends the STEP: no Flusher turn before it, one loop turn earlier."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    client, peer = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    pool = writer_pool.WriterPool(1)
    pool.links = [WriterLink(pool, ours, WriterProcess())]
    try:
        stream = RequestStream("cmpl-1")
        sender = HandoffSender(Tracked(None, stream, None), Writer(Transport(client, unsent=0)),
                               ChunkEncoder(Identity("completion", "cmpl-1", 1, "sim", "fp"), False), False, Obs(),
                               pool=pool)
        stream.listen(sender.listener(Flusher()))
        assert wire.decode(theirs.recv(1 << 16))[0] == wire.OPEN
        stream.push_token(7, "hi")
        await asyncio.sleep(0)                          # one turn of the loop
        assert wire.decode(theirs.recv(1 << 16)) == [wire.STEP, [[sender.sid, "hi", 1, sender.pushed_at]]]
    finally:
        for s in (ours, theirs, client, peer):
            s.close()


async def test_only_a_handed_over_streams_first_tokens_are_observed_here_and_its_last_tokens_time_is_kept():
    """Its TTFT is this process's; the ITLs are the writer's, as its socket takes the frames (DELAYS). The time the
    last tokens went over still reaches the request's mean ITL (RequestObservation.finish)."""
    a, b = socket.socketpair()
    try:
        obs = Obs()
        sender, pool, stream = sender_on(a, obs)
        for word in ("one", "two", "six"):
            stream.push_token(1, word)
            sender.flush()
        assert obs.observed == [1] and [m[1][0][1] for m in pool.link.sent[1:]] == ["one", "two", "six"]
        stream.push(Delta(text="!", token_ids=[2], finish_reason=FinishReason.STOP))
        sender.flush()
        assert obs.observed == [1]
        sender.release()
        assert obs.last == sender.last_text > 0
    finally:
        a.close()
        b.close()


async def test_tokens_read_without_text_go_to_the_writer_and_ttft_waits_for_the_first_tokens():
    """Text held back (a character's first bytes, a stop string's prefix) still has its tokens counted by the writer,
    so a later frame's tokens are its own; text that carries no token is not the first tokens' latency."""
    a, b = socket.socketpair()
    try:
        obs = Obs()
        sender, pool, stream = sender_on(a, obs)
        stream.push_token(1, "")
        sender.flush()
        assert pool.link.sent[-1] == [wire.STEP, [[sender.sid, "", 1]]] and obs.observed == []
        stream.push(Delta(text="x", token_ids=[]))
        sender.flush()
        assert pool.link.sent[-1] == [wire.STEP, [[sender.sid, "x", 0]]] and obs.observed == []
        stream.push_token(2, "y")
        sender.flush()
        assert obs.observed == [1]
    finally:
        a.close()
        b.close()
