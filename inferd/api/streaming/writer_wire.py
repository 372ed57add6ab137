"""The messages between the main process and its SSE writer processes (inferd.api.streaming.writers).

One SOCK_SEQPACKET socket pair per writer: message boundaries are kept, and a client socket handed
over with SCM_RIGHTS rides on the message that opens its stream, so it can never arrive out of order
with that stream's frames. Each message is one orjson array, its first element the kind:

main -> writer
  OPEN   [OPEN, sid, chunked, kind, id, created, model, fingerprint, include_usage,
          prompt_tokens]    + the client's fd; prompt_tokens null but for continuous usage stats
  STEP   [STEP, [[sid, text, tokens], ...]]   every stream's new text since the last step, one message
  RAW    [RAW, sid, frame]                    frames the main process encoded (the final ones, pings, [DONE])
  CLOSE  [CLOSE, sid]                         write what is left, end the chunked body, close the connection
  ABORT  [ABORT, sid]                         close the connection now, nothing more written

writer -> main
  GONE     [GONE, sid]       the client left (a failed send, or its end of the connection closed)
  BLOCKED  [BLOCKED, sid]    the client is not keeping up: send no more text until DRAINED
  DRAINED  [DRAINED, sid]
"""
from __future__ import annotations

import orjson

OPEN, STEP, RAW, CLOSE, ABORT = "o", "s", "r", "c", "a"
GONE, BLOCKED, DRAINED = "g", "b", "d"

# The largest message either side reads. A STEP is sent once past SPLIT_AT, and text longer than
# TEXT_PIECE goes as several entries (inferd.api.streaming.writers): a SOCK_SEQPACKET message must fit
# the send buffer whole, which the kernel caps at net.core.wmem_max (about 208 KiB by default).
MAX_MESSAGE = 1 << 20
SPLIT_AT = 64 << 10
TEXT_PIECE = 16 << 10
# The socket pair's send buffers (the kernel caps them at net.core.wmem_max).
SOCKET_BUFFER = 4 << 20


def encode(message: list) -> bytes:
    return orjson.dumps(message)


def decode(data: bytes) -> list:
    return orjson.loads(data)
