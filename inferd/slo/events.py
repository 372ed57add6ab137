"""Which finished requests an SLO counts, and whether each was good (docs/slos.md).

A request becomes one `RequestOutcome` when it ends; `judge` says, per SLO, whether it is an event
of that SLO's SLI and if so whether it was good. Requests an SLI has nothing to say about are not
events at all (not good ones): a quota refusal is no availability event, a client that hung up is
no event of any SLI, a request that never got a token is no TTFT event (its failure counts against
availability instead), and a 504 of a deadline the client set shorter than the server's is no event.
"""
from __future__ import annotations

import msgspec

from inferd.config import PriorityClass, SloConfig

CLIENT_GONE = 499   # the status the API records when the client left (inferd.api.errors.CLIENT_GONE)


class RequestOutcome(msgspec.Struct, frozen=True):
    """One finished request, as the SLOs see it."""

    requested: str | None           # the model name the client asked for: a served model or an alias
    model: str | None               # the served model it was routed to (None: refused before routing)
    priority: PriorityClass | None  # its admission class
    status: int                     # the HTTP status it answered with (a stream: how it ended)
    streamed: bool                  # SSE headers went out
    client_deadline: bool = False   # the client asked for a deadline shorter than the server's
    ttft_s: float | None = None     # arrival to the first token at the client
    itl_s: float | None = None      # mean gap between its tokens (two or more tokens)
    latency_s: float | None = None  # arrival to the whole answer (a 200)


def matches(slo: SloConfig, outcome: RequestOutcome) -> bool:
    """The SLO is about this request: it asked for (or was routed to) the SLO's model, in its class."""
    if slo.model != outcome.requested and slo.model != outcome.model:
        return False
    return slo.priority is None or slo.priority is outcome.priority


def judge(slo: SloConfig, outcome: RequestOutcome) -> bool | None:
    """True (good), False (bad), or None: not an event of this SLO's SLI."""
    status = outcome.status
    if status == CLIENT_GONE:
        return None
    sli = slo.sli
    if sli == "ttft":
        return None if outcome.ttft_s is None else outcome.ttft_s * 1000.0 <= slo.threshold_ms
    if sli == "itl":
        return None if outcome.itl_s is None else outcome.itl_s * 1000.0 <= slo.threshold_ms
    if sli == "latency":
        if status != 200 or outcome.latency_s is None:
            return None
        return outcome.latency_s * 1000.0 <= slo.threshold_ms
    if 400 <= status < 500:             # the client's error or an intentional refusal (quota, size, auth)
        return None
    if status == 504 and outcome.client_deadline:     # the client's own short deadline, not a server failure
        return None
    if sli == "availability":
        return status < 500
    return status < 400 if outcome.streamed else None     # stream_completion: ended with [DONE]
