"""inferd.api.streaming.accepted through the real daemon: a stream whose client stops reading is billed for
what reached its socket, not for what the engine generated or what waits in the daemon's or kernel's buffers."""
from __future__ import annotations

import asyncio
import fcntl
import json
import socket
import ssl
import struct
import termios

import aiohttp
import msgspec
import pytest

from inferd.api.streaming import accepted as accepted_module
from inferd.api.streaming.accepted import MAX_PENDING, SocketAccepted
from inferd.config.root import load_config
from tests.api.pipeline.test_billing import config, settled_rows
from tests.api.pipeline.test_usage import PRICES
from tests.daemon.harness import running_daemon, sim_model, until, write_config
from tests.daemon.tls_certs import TestCA, needs_openssl

GENERATED = 1900
BODY = {"model": "sim", "prompt": "hello there", "max_tokens": GENERATED, "ignore_eos": True, "temperature": 0,
        "stream": True, "logprobs": 5}


def complete_events(data: bytes):
    """The JSON events (`data: {...}`) in the complete chunks of a chunked SSE response's start (headers included)."""
    _, _, rest = data.partition(b"\r\n\r\n")
    while True:
        size_line, sep, tail = rest.partition(b"\r\n")
        if not sep or not size_line or len(tail) < int(size_line, 16) + 2:
            return
        size = int(size_line, 16)
        for line in tail[:size].split(b"\n"):
            if line.startswith(b"data: {"):
                yield json.loads(line[6:])
        rest = tail[size + 2:]


def frames_tokens(data: bytes) -> int:
    """Output tokens in the complete chunks of a chunked SSE response's start (headers included)."""
    return sum(len(event["choices"][0]["logprobs"]["tokens"]) for event in complete_events(data))


SHORT = {**BODY, "max_tokens": 250, "logprobs": 1}


async def raw_stream(url: str, body: dict = BODY, rcvbuf: int = 4096) -> socket.socket:
    """A streamed completion on a bare socket with a small receive buffer (set before connecting)."""
    host, port = url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await loop.sock_connect(sock, (host, int(port)))
    payload = json.dumps(body).encode()
    await loop.sock_sendall(sock, f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
                                  f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


async def stalled_on(sock: socket.socket, engine) -> int:
    """Wait until the stream is all generated and the client's socket holds still (kernel queues have no
    event: two equal readings of its unread bytes); those bytes, what reached the client."""
    unread = [-1]

    async def stalled() -> bool:
        before, unread[0] = unread[0], struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        return engine.stats().running == 0 and unread[0] == before
    await until(stalled, "the stream to stall on its client", timeout_s=30)
    return unread[0]


async def test_a_client_that_stops_reading_is_billed_for_what_its_socket_took(tmp_path):
    async with running_daemon(config(tmp_path, time_scale=0.01)) as (daemon, _, url), \
            aiohttp.ClientSession() as http:
        sock = await raw_stream(url)
        loop = asyncio.get_running_loop()
        got = b""
        while frames_tokens(got) < 3:               # a few frames, then it stops reading
            got += await loop.sock_recv(sock, 1024)
        unread = await stalled_on(sock, daemon.state.engines["sim"])
        reached = got + sock.recv(unread, socket.MSG_PEEK)      # all that reached the client's socket
        sock.close()                                            # with unread data: a reset
        [row] = await settled_rows(http, url, 1)
        assert row["status"] == 499 and row["stream"]
        assert 0 < row["completion_tokens"] <= frames_tokens(reached) < GENERATED


async def test_a_lost_connection_is_read_once_more_before_its_socket_closes(tmp_path, monkeypatch):
    after_loss = []                             # what each sample taken once the connection was lost could read
    sample = SocketAccepted.sample

    def watched(self) -> None:
        if self._transport is not None and self._transport.is_closing() and self._sock is not None:
            after_loss.append(accepted_module._bytes_acked(self._sock))
        sample(self)
    monkeypatch.setattr(SocketAccepted, "sample", watched)
    async with running_daemon(config(tmp_path, time_scale=0.01)) as (_, _, url), aiohttp.ClientSession() as http:
        sock = await raw_stream(url, SHORT)
        got = b""
        while frames_tokens(got) < 3:
            got += await asyncio.get_running_loop().sock_recv(sock, 1024)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()                            # a reset
        [row] = await settled_rows(http, url, 1)
    assert row["status"] == 499
    assert any(acked is not None and acked > 0 for acked in after_loss)   # the socket was still there to read


class FakeTransport:
    """A transport whose user-space buffer the test sets (no socket: the send queue reads as empty)."""

    def __init__(self) -> None:
        self.buffered = 0
        self.closing = False

    def get_extra_info(self, name: str):
        return None

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closing


def test_only_frames_wholly_out_of_user_space_count_and_nothing_is_sampled_after_close():
    transport, counted = FakeTransport(), SocketAccepted()
    counted.attach(transport)
    transport.buffered = 150
    for tokens in (2, 3, 4):        # frames of 100 bytes: 2, 5, 9 tokens in all
        counted.took(tokens)
        counted.wrote(100)
    counted.sample()
    assert counted.delivered_tokens == 2        # 300 written, 150 still buffered: the second frame is half out
    transport.buffered, transport.closing = 0, True     # the connection was lost: its buffer dropped
    counted.sample()
    assert counted.delivered_tokens == 2


async def test_a_short_stream_whose_client_stops_reading_is_499_billed_what_reached_it_within_the_bound(tmp_path):
    cfg = config(tmp_path, time_scale=0.01)
    cfg = msgspec.structs.replace(cfg, server=msgspec.structs.replace(cfg.server, stream_ack_timeout_s=0.3))
    async with running_daemon(cfg) as (_, _, url), aiohttp.ClientSession() as http:
        sock = await raw_stream(url, SHORT)      # about 50 KB: it fits the daemon's buffers, never paused
        loop = asyncio.get_running_loop()
        got = b""
        while frames_tokens(got) < 3:           # a few frames, then it stops reading, its window full
            got += await loop.sock_recv(sock, 1024)
        [row] = await settled_rows(http, url, 1)    # not the request's 600 s deadline: the 0.3 s bound
        unread = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        reached = got + sock.recv(unread, socket.MSG_PEEK)
        sock.close()
        assert row["status"] == 499 and row["stream"]
        assert 0 < row["completion_tokens"] <= frames_tokens(reached) < SHORT["max_tokens"]


async def test_a_completed_stream_is_still_200_with_its_full_usage(tmp_path):
    async with running_daemon(config(tmp_path, time_scale=0.01)) as (_, _, url), aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json=SHORT) as resp:
            body = await resp.read()
        assert body.rstrip().endswith(b"data: [DONE]")
        [row] = await settled_rows(http, url, 1)
        assert row["status"] == 200 and row["completion_tokens"] == SHORT["max_tokens"]


def test_a_ping_acknowledged_never_counts_tokens_whose_text_an_encoder_still_holds_back():
    transport, counted = FakeTransport(), SocketAccepted()
    counted.attach(transport)
    counted.took(2)
    counted.wrote(100)                          # a frame with 2 tokens' text
    counted.took(3)                             # read, but held back (a tool call's start): no frame yet
    counted.wrote(10, content=False)            # a keep-alive ping
    counted.sample()
    assert counted.delivered_tokens == 2        # everything acknowledged: the ping carried none of the 3
    counted.wrote(50)                           # the held text goes out
    counted.sample()
    assert counted.delivered_tokens == 5


def test_pending_frames_merge_past_the_cap_and_never_count_an_unacknowledged_one():
    transport, counted = FakeTransport(), SocketAccepted()
    counted.attach(transport)
    transport.buffered = 10 ** 9                # nothing leaves: every frame stays pending
    for _ in range(MAX_PENDING * 3):
        counted.took(1)
        counted.wrote(10)
    assert len(counted._pending) <= MAX_PENDING
    transport.buffered = 10 * MAX_PENDING       # all but the last MAX_PENDING frames out
    counted.sample()
    assert 0 < counted.delivered_tokens <= 2 * MAX_PENDING


class SocketTransport(FakeTransport):
    """A transport over a real TCP socket, written directly (nothing waits in user space)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock

    def get_extra_info(self, name: str):
        return self.sock if name == "socket" else None


def loopback_pair(rcvbuf: int = 4096) -> tuple[socket.socket, socket.socket]:
    """(server side, client side) of a loopback TCP connection; the client's receive buffer set before connecting."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        client.connect(listener.getsockname())
        server, _ = listener.accept()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)     # what the client's window leaves out waits here
    return server, client


def int_ioctl(sock: socket.socket, request: int) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0" * 4))[0]


def tcp_state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


async def test_a_client_that_resets_is_billed_exactly_the_frames_it_acknowledged_read_after_the_reset():
    server, client = loopback_pair()
    transport, counted = SocketTransport(server), SocketAccepted()
    server.sendall(b"h" * 77)                   # the headers: written before the stream's frames, never counted
    counted.attach(transport)
    for _ in range(40):                         # 40 frames of 1000 bytes, a token each: more than the client's window
        counted.took(1)
        counted.wrote(1000)
        server.sendall(b"f" * 1000)
    assert counted.delivered_tokens == 0        # no sample per frame: TCP_INFO is read when asked
    held = [-1]

    async def acknowledged_all_it_holds() -> bool:  # the window full, and its delayed ACKs sent
        before, held[0] = held[0], int_ioctl(client, termios.FIONREAD)
        return held[0] == before == 77 + 40 * 1000 - int_ioctl(server, termios.TIOCOUTQ)
    await until(acknowledged_all_it_holds, "the client's window to fill and be acknowledged")
    reached = held[0] - 77                      # the frames' bytes in its socket: all acknowledged
    assert 0 < reached < 40 * 1000
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()                              # a reset: the server's send queue is dropped
    async def reset() -> bool:
        return tcp_state(server) == 7           # TCP_CLOSE
    await until(reset, "the reset to arrive")
    transport.closing = True
    counted.sample()
    assert counted.delivered_tokens == reached // 1000
    server.close()
    counted.sample()                            # a closed socket reads nothing, and changes nothing
    assert counted.delivered_tokens == reached // 1000


async def test_a_stream_is_complete_once_all_but_its_last_frame_left_and_a_client_that_left_raises():
    transport, counted = FakeTransport(), SocketAccepted()
    counted.attach(transport)
    for _ in range(3):
        counted.took(1)
        counted.wrote(10)
    transport.buffered = 10                     # only the final frame still buffered
    await counted.acknowledged(5)
    transport.buffered, transport.closing = 25, True
    counted.wrote(10)
    with pytest.raises(ConnectionResetError):
        await counted.acknowledged(5)


@needs_openssl
async def test_over_tls_a_client_that_stops_reading_is_billed_at_most_what_it_received(tmp_path):
    ca = TestCA(tmp_path / "pki")
    ca.issue("server", serial=1)
    tls = '[server.tls]\ncert_file = "pki/server.pem"\nkey_file = "pki/server.key"\n'
    cfg = load_config(write_config(tmp_path / "inferd.toml", {"sim": sim_model(time_scale=0.01)}, PRICES + tls))
    connector = aiohttp.TCPConnector(ssl=ca.client_context())
    async with running_daemon(cfg) as (daemon, _, _), aiohttp.ClientSession(connector=connector) as http:
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", daemon.port))
        client = TlsClient(sock, ca.client_context())
        await client.handshake()
        payload = json.dumps(BODY).encode()
        await client.send(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        while frames_tokens(client.plain) < 3:      # a few frames, then it stops reading
            client.received(await loop.sock_recv(sock, 1024))
        client.received(sock.recv(await stalled_on(sock, daemon.state.engines["sim"])))       # all that reached the client's socket, decrypted
        sock.close()
        [row] = await settled_rows(http, f"https://127.0.0.1:{daemon.port}", 1)
        assert row["status"] == 499 and row["stream"]
        # Never more than it received. How much of that is billed depends on when the server last sampled
        # before the client left (a loaded machine may not have since the client's ACKs): at least 0.
        assert 0 <= row["completion_tokens"] <= frames_tokens(client.plain) < GENERATED


class TlsClient:
    """TLS over a bare socket (memory BIOs), so the test reads exactly what reached the socket."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.sock, self.incoming, self.outgoing = sock, ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        self.plain = b""

    async def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                return await self._flush()
            except ssl.SSLWantReadError:
                await self._flush()
                self.incoming.write(await asyncio.get_running_loop().sock_recv(self.sock, 65536))

    async def send(self, data: bytes) -> None:
        self.tls.write(data)
        await self._flush()

    def received(self, data: bytes) -> None:
        self.incoming.write(data)
        while True:
            try:
                chunk = self.tls.read(65536)
            except ssl.SSLWantReadError:        # the rest of a record has not arrived
                return
            if not chunk:
                return
            self.plain += chunk
