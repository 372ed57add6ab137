"""One generation request once the cheap checks, routing and tokenization are done: what running it needs.

completions.py builds a GenerationContext step by step in request-path order (authenticate, decode,
route, check the tenant may use the model, tokenize, limits, deadline) and hands the whole of it to
the part that admits, streams and accounts for the request, instead of a long parameter list.
"""
from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.openai import Prepared
from inferd.api.state import ServerState
from inferd.api.waiting import QueuedStream
from inferd.engine import Engine
from inferd.models import Route
from inferd.safety import Policy
from inferd.types import SamplingParams


@dataclass(frozen=True, slots=True)
class GenerationContext:
    """The per-request facts of one completion or chat completion, fixed before it is admitted."""

    request: web.Request
    state: ServerState
    tenant: str                     # from the API key (or `local` with auth off)
    prepared: Prepared              # the validated body: kind, prompt or messages, stream, stop, ...
    route: Route                    # the version (and LoRA adapter) routing chose
    model: str                      # the served model name (route.target.model)
    engine: Engine                  # the loaded engine of route.target
    prompt_ids: list[list[int]]     # one per choice: a completions request may send a list of prompts
    sampling: list[SamplingParams]  # one per choice, after the model's context and the tenant's limits
    deadline: float                 # absolute, time.monotonic()
    body: bytes = b""               # as received: spillover forwards it unchanged (inferd.api.spill)
    forwarded: bool = False         # a peer forwarded it (charged there; never forwarded again)
    batch_id: str | None = None     # a line of this batch, sent by the Batch API's runner (inferd.api.internal)
    degraded: str = ""              # what overload degradation did to it (X-Inferd-Degraded; inferd.api.degrade)
    policy: Policy | None = None    # the tenant's content policy (inferd.safety), when it has one
    early: QueuedStream | None = None   # a stream whose headers went out while its model loaded (issue 17)

    @property
    def kind(self) -> str:
        """"completion" or "chat"."""
        return self.prepared.kind

    @property
    def request_id(self) -> str:
        return self.request[keys.REQUEST_ID]

    @property
    def arrival(self) -> float:
        """time.monotonic() when the request arrived (the front middleware stamps it)."""
        return self.request[keys.ARRIVAL]
