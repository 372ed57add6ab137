"""The messages between the main process and its SSE writer processes (inferd.api.streaming.writers).

One SOCK_SEQPACKET socket pair per writer: message boundaries are kept, and a client socket handed
over with SCM_RIGHTS rides on the message that opens its stream, so it can never arrive out of order
with that stream's frames. Each message is one orjson array, its first element the kind:

main -> writer
  OPEN   [OPEN, sid, chunked, kind, id, created, model, fingerprint, include_usage,
          prompt_tokens, series]    + the client's fd; prompt_tokens null but for continuous usage stats;
                                    series: the main process's number for the stream's metric labels
  STEP   [STEP, [[sid, text, tokens, pushed_at], ...]]   every stream's new text since the last step, one
                                              message; pushed_at: when the engine pushed its oldest token
                                              (CLOCK_MONOTONIC, which both processes read alike), or null
  RAW    [RAW, sid, frame, taken]             frames the main process encoded (the final ones, pings, [DONE]);
                                              taken: the output tokens it read so far in all (the final delta's
                                              included), which the frame carries, for billing
  ACK    [ACK, sid, bound_s]                  the final frames were just sent: answer ACKED once the client
                                              acknowledged every byte before them, or after bound_s
  CLOSE  [CLOSE, sid, grace_s]                write what is left, then hand the socket back (RETURNED): the main
                                              process ends the body (a chunk, or the connection's close for
                                              HTTP/1.0) and reads the client's next request; dropped after
                                              grace_s if its client has not taken it all
  ABORT  [ABORT, sid]                         close the connection now, nothing more written

writer -> main
  GONE     [GONE, sid, tokens]        the client left (a failed send, or its end of the connection closed);
                                      tokens: the output tokens in frames its socket acknowledged (it is billed those)
  BLOCKED  [BLOCKED, sid, 0]          the client is not keeping up: send no more text until DRAINED
  DRAINED  [DRAINED, sid, 0]
  ACKED    [ACKED, sid, tokens, ok]   the answer to ACK: ok true once acknowledged, false when the bound passed first
  RETURNED [RETURNED, sid, tokens, ok] the answer to CLOSE: ok true once everything was written (the
                                      writer closed its copy of the socket; the connection is the main process's
                                      again), false when the client left or grace_s passed first (dropped)
  DELAYS   [DELAYS, delays, itls]     with the TOOK samples, each [[series, counts, sum], ...]: the write delays
                                      observed since the last (from pushed_at to the socket taking the frame) as counts
                                      per bucket of inferd_stream_write_delay_seconds, and the inter-token latencies (a
                                      stream's frames after its first: the time since its socket took the previous
                                      ones, over their tokens) per bucket of inferd_inter_token_latency_seconds, for
                                      the main process's histograms
  TOOK     [TOOK, sid, tokens]        the acknowledged tokens grew (sampled a few times a second, as the in-process
                                      watchdog does), so a stream that ends without ACK (an error, its deadline) is
                                      billed what its client took

The writer counts what each client acknowledged with the in-process accounting
(inferd.api.streaming.accepted.SocketAccepted: bytes written against the socket's send queue); the main
process's Tracked.accepted takes the numbers these reports carry. Reports to the main process are queued
while its socket is full and sent in order once it is writable (never dropped: a GONE lost would leave its
engine request running).
"""
from __future__ import annotations

import orjson

OPEN, STEP, RAW, CLOSE, ABORT, ACK = "o", "s", "r", "c", "a", "k"
GONE, BLOCKED, DRAINED, ACKED, TOOK, RETURNED, DELAYS = "g", "b", "d", "K", "t", "n", "w"
READY = "R"        # [READY]: the writer has imported and listens (streams handed earlier would wait for it)

# The largest message either side reads. A STEP is sent once past SPLIT_AT, and text longer than
# TEXT_PIECE goes as several entries (inferd.api.streaming.writers): a SOCK_SEQPACKET message must fit
# the send buffer whole, which the kernel caps at net.core.wmem_max (about 208 KiB by default).
MAX_MESSAGE = 1 << 20
SPLIT_AT = 64 << 10
TEXT_PIECE = 16 << 10
# The socket pair's send buffers (the kernel caps them at net.core.wmem_max).
SOCKET_BUFFER = 4 << 20


def text_pieces(text: str) -> list[str]:
    """`text` cut into TEXT_PIECE pieces, so that each message carrying one fits a SOCK_SEQPACKET send: text
    merged while a client was blocked (a STEP entry, a final RAW frame) can be far larger. A RAW piece is
    written as its own HTTP chunk."""
    return [text[at:at + TEXT_PIECE] for at in range(0, len(text), TEXT_PIECE)] or [text]


def encode(message: list) -> bytes:
    return orjson.dumps(message)


def decode(data: bytes) -> list:
    return orjson.loads(data)
