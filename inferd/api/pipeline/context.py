"""One request on its way through the pipeline: what each stage found, for the stages after it.

Every stage reads and fills the same RequestContext, in the pipeline's order; `settle` reads what was
reached to decide what the request's end records. Fields a stage has not reached yet keep their
defaults, so a refusal at any point leaves a context that `settle` can read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from inferd.admission import Lease
from inferd.api import appkeys as keys
from inferd.api.pipeline.timeline import Timeline
from inferd.api.state import ServerState
from inferd.api.streaming.waiting import QueuedStream
from inferd.api.wire.endpoints import ENDPOINTS, Endpoint
from inferd.engine import Engine
from inferd.models import Route, VersionLease
from inferd.observability import RequestObservation
from inferd.safety import Policy
from inferd.tenancy import NO_TURN, Turn
from inferd.types import Delta, SamplingParams

# How far a request got, in order: what its end must account for (settle.py).
FRONT = 0        # refused (or answered) by the cheap checks: counted, never billed
TRACKED = 1      # past them: in flight for a drain, traced, observed
CHARGED = 2      # admission was asked: it has a ledger row whatever happens next
RUNNING = 3      # the engine is generating for it (or a cache hit replays)


@dataclass(slots=True, eq=False)
class RequestContext:
    """The per-request facts, filled stage by stage (see run.py for the order)."""

    request: web.Request
    state: ServerState
    kind: str                           # "completion" | "chat" | "responses" | "embedding"
    timeline: Timeline
    tenant: str = ""                    # from the API key (or `local` with auth off)
    turn: Turn = NO_TURN                # refusal pacing's turn (inferd.tenancy.refusals)
    forwarded: bool = False             # a peer forwarded it (charged there; never forwarded again)
    forwarded_identity: Any = None      # who the peer says the caller is (inferd.api.pipeline.spill)
    batch_id: str | None = None         # a line of this batch, sent by the Batch API's runner
    is_batch: bool = False
    body: bytes = b""                   # as received: spillover forwards it unchanged
    wire: Any = None                    # the decoded body (inferd.api.wire.openai / embedding_format)
    prepared: Any = None                # generation: Prepared; embeddings: the inputs' text
    deadline: float = 0.0               # absolute, time.monotonic()
    early: QueuedStream | None = None   # a stream whose headers may go out while its model loads
    route: Route | None = None          # the version (and LoRA adapter) routing chose
    model: str = "other"                # the served model name (route.target.model)
    engine: Engine | None = None        # the loaded engine of route.target
    version_lease: VersionLease | None = None   # keeps the routed version loaded until the end
    degraded: str = ""                  # what overload degradation did (X-Inferd-Degraded)
    degraded_max_tokens: int | None = None
    allowed_model: str = ""             # the name the tenant's permission allowed (quota limits)
    prompt_ids: list[list[int]] = field(default_factory=list)     # one per choice / input
    sampling: list[SamplingParams] = field(default_factory=list)  # one per choice / input
    policy: Policy | None = None        # the tenant's content policy (inferd.safety), when it has one
    reached: int = FRONT
    obs: RequestObservation | None = None
    quota_lease: Lease | None = None    # the tenant's quota charge (None: a peer charged it)
    headers: dict[str, str] = field(default_factory=dict)   # the response's own headers
    tracked: Any = None                 # state.track()'s in-flight count, entered by begin_tracking
    served_by_peer: bool = False        # a peer took it (spill): the peer records, bills and judges it
    extras: dict[str, Any] = field(default_factory=dict)    # endpoint-specific facts (embeddings: width)
    queued: QueuedStream | None = None  # the stream whose headers went out while it waited, if any
    last: Delta | None = None           # the final (merged) delta, once the engine gave one
    delivered: Any = None               # what counts the tokens the client got (a stream, or None)
    recorded: bool = False              # its ledger row is written (once)
    cache_hit: Delta | None = None
    cache_plan: Any = None
    recording: Any = None               # the text as the client got it (cache, transcript)
    engine_failed: bool = False         # the engine refused it as unavailable: the version's failure
    streamed: bool = False              # SSE headers went out
    status: int | None = None           # the status the response settled on, once known
    client_gone: bool = False           # its client left while the engine generated for it

    @property
    def endpoint(self) -> Endpoint:
        """What this endpoint calls its fields, its ids and its ledger rows (inferd.api.wire.endpoints)."""
        return ENDPOINTS[self.kind]

    @property
    def request_id(self) -> str:
        return self.request[keys.REQUEST_ID]

    @property
    def choices_per_prompt(self) -> int:
        """`n`: consecutive entries of prompt_ids share one prompt (1 for embeddings)."""
        return getattr(self.prepared, "n", 1)

    @property
    def prompt_tokens(self) -> int:
        """The prompts' tokens, each prompt once however many choices it has (as usage reports them)."""
        return sum(map(len, self.prompt_ids[::self.choices_per_prompt]))

    @property
    def arrival(self) -> float:
        """time.monotonic() when the request arrived (the front middleware stamps it)."""
        return self.timeline.arrival

    @property
    def log_fields(self) -> dict:
        return self.request[keys.LOG_FIELDS]

    @property
    def headers_out(self) -> bool:
        """A stream's headers went out while it waited (for its model or in admission)."""
        waiting = self.queued if self.queued is not None else self.early
        return waiting is not None and waiting.prepared is not None
