"""A request's record in an admission queue, from entering it to ending, and the refusal of one."""
from __future__ import annotations

import asyncio
import math
from typing import Any, Protocol

from inferd.config import PriorityClass
from inferd.types import GenerationRequest, Usage

QUEUED, DISPATCHED, DONE = 0, 1, 2
UNKNOWN_RETRY_S = 1.0          # Retry-After with nothing to estimate from (no throughput measured yet; draining)


def retry_after_header(seconds: float) -> str:
    """`Retry-After` value: whole seconds, at least 1 (HTTP's has no fractions); never infinite."""
    if not math.isfinite(seconds):
        seconds = 60.0
    return str(max(1, math.ceil(seconds)))


class Lease(Protocol):
    """A quota lease (inferd.tenancy's Lease): handed back, with the usage, when the request ends."""

    def release(self, usage: Usage | None) -> None: ...


class AdmissionRejected(Exception):
    """The request was not (or no longer) admitted. status: 429 queue_full / own backlog too deep for
    the deadline; 503 node_full / shed / deadline / ttl / draining; 504 deadline passed while queued."""

    def __init__(self, message: str, *, status: int, reason: str, retry_after_s: float | None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str | None:
        """`Retry-After` value (whole seconds, at least 1) or None."""
        return None if self.retry_after_s is None else retry_after_header(self.retry_after_s)

    @classmethod
    def draining(cls) -> AdmissionRejected:
        return cls("server is draining", status=503, reason="draining", retry_after_s=UNKNOWN_RETRY_S)


class Ticket:
    __slots__ = ("request", "tenant", "cls", "prompt", "tokens", "est_cost", "deadline", "expires",
                 "arrived", "seq", "future", "timer", "state", "lease", "stream", "grouped", "parked", "output")

    def __init__(self, request: GenerationRequest, cls: PriorityClass, est_cost: float, deadline: float,
                 expires: float, arrived: float, seq: int, lease: Lease | None) -> None:
        self.request = request
        self.tenant = request.tenant
        self.cls = cls
        self.prompt = len(request.prompt_token_ids)
        self.tokens = self.prompt + request.sampling.max_tokens
        self.est_cost = est_cost
        self.deadline = deadline
        self.expires = expires          # min(deadline, enqueue + class TTL)
        self.arrived = arrived
        self.seq = seq
        self.future: asyncio.Future[Any] | None = None   # set when it waits in the queue; resolves to its AdmittedStream
        self.timer: asyncio.TimerHandle | None = None
        self.state = QUEUED
        self.lease = lease
        self.stream: Any = None         # its AdmittedStream when `enter` released it at once
        self.grouped = False            # a part of a request of several (AdmissionQueue.enter): never shed
        self.parked = False             # its sequence yielded its slot to another tenant's (admission.slots)
        self.output = 0                 # output tokens delivered so far (charged: admission.stream)
