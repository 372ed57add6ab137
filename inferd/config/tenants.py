"""Tenants, auth and admission settings: the `[auth]`, `[tenants.<name>]` and `[admission]` tables.

Plain frozen structs in the same style as inferd.config.root (unknown keys rejected, plain field types),
plus `*_errors()` functions returning `path: problem` lines so the config loader can report every
semantic problem at once. Nothing here has behaviour beyond lookups: inferd.tenancy.quota and
inferd.admission read these structs; a reload builds a new TenantRegistry and swaps it in.
"""
from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Literal

from inferd.config.walk import ConfigTable

AuthMode = Literal["none", "api_key"]
Scheduling = Literal["vtc", "fcfs"]
SpendPeriod = Literal["day", "month"]

# Tenant names become metric labels and key-file fields: keep them plain and short.
TENANT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LOCAL_TENANT = "local"          # every request is this tenant when auth = "none"
OTHER_LABEL = "other"           # metric label for tenants not named in the config


class PriorityClass(str, enum.Enum):
    """Served strictly in this order, except for the share reserved for lower classes."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 = served first."""
        return _RANK[self]


_RANK = {PriorityClass.INTERACTIVE: 0, PriorityClass.STANDARD: 1, PriorityClass.BATCH: 2}
CLASSES_BY_RANK = (PriorityClass.INTERACTIVE, PriorityClass.STANDARD, PriorityClass.BATCH)


class AuthConfig(ConfigTable):
    """`[auth]`. The shipped default is no auth on loopback: every request is tenant `local`."""

    mode: AuthMode = "none"
    keys_file: str | None = None                # relative to the config file; default <server.state_dir>/keys.jsonl
    secret_file: str | None = None              # HMAC-SHA256 key for key hashes; None = plain SHA-256
    allow_unauthenticated_non_loopback: bool = False
    anonymous_tenant: str = LOCAL_TENANT        # tenant of every request when mode = "none"
    # mode = "api_key": one more key, any string, given as its SHA-256 hex (`inferd serve --model --api-key K`,
    # as vLLM takes it); a request bearing it is anonymous_tenant with every scope. None: keys_file's keys only.
    static_key_sha256: str | None = None


class TenantConfig(ConfigTable):
    """`[tenants.<name>]`. `None` means no limit of that kind (the engine's own limits still apply)."""

    weight: float = 1.0                         # share of service relative to other backlogged tenants
    priority: PriorityClass = PriorityClass.STANDARD
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None        # prompt + max_tokens charged up front, unused refunded
    # Queued + running. None: no cap of its own (the node's admission queue still bounds it); the anonymous
    # tenant of a node without auth has none unless [tenants.<it>] sets one (inferd.tenancy.tenant_registry).
    max_concurrent_requests: int | None = 64
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None        # also the max_tokens used when a request sets none
    allowed_models: tuple[str, ...] = ("*",)    # served model names; "*" = any
    max_kv_tokens_in_flight: int | None = None  # prompt + max_tokens of this tenant's running requests
    max_queued_requests: int = 256
    max_queued_tokens: int = 1_048_576          # prompt + max_tokens of queued requests
    max_request_timeout_s: float = 600.0
    # Cost controls (inferd.tenancy.budget), counted from the usage ledger, UTC periods.
    max_spend: float | None = None              # in the currency of [prices], per spend_period
    spend_period: SpendPeriod = "month"
    max_tokens_per_day: int | None = None       # prompt + completion tokens recorded per UTC day
    budget_warn_fraction: float = 0.8           # crossing it: a metric and an audit record
    # The [policies.<name>] its requests are filtered by (None: no filtering).
    policy: str | None = None
    cache_responses: bool = False               # use the response cache ([cache]) for deterministic requests
    # "none" (the default): no prompt or completion text is kept anywhere. A period ("7d", "12h", "30m"):
    # each request's text is kept that long (inferd.store.transcripts), then deleted.
    retention: str = "none"
    # Files (inferd.api.routes.upload_gate): bytes of files it may hold, uploads and batch outputs
    # (an upload that would pass it: 413 file_quota_exceeded), and uploads running at once on a node
    # (more: 429 too_many_concurrent_uploads).
    max_stored_file_bytes: int = 10 * 1024 ** 3
    max_concurrent_uploads: int = 4

    @property
    def retention_s(self) -> float:
        return retention_seconds(self.retention)

    def allows_model(self, model: str) -> bool:
        return "*" in self.allowed_models or model in self.allowed_models


class AdmissionConfig(ConfigTable):
    """`[admission]`: the per-engine admission queue."""

    scheduling: Scheduling = "vtc"              # "fcfs" = one FIFO behind the same capacity gate
    prompt_cost_weight: float = 1.0             # VTC cost = prompt * this + output * output_cost_weight
    output_cost_weight: float = 2.0
    standard_reserved_share: float = 0.10       # of cost served while standard waits behind interactive
    batch_reserved_share: float = 0.05          # of cost served while batch waits behind higher classes
    interactive_ttl_s: float = 30.0             # longest time a request of the class may sit queued
    standard_ttl_s: float = 120.0
    batch_ttl_s: float = 600.0
    max_queued_requests: int = 2048             # the whole node (per engine); full -> 503 node_full
    max_queued_tokens: int = 4_194_304
    kv_reserve_fraction: float = 0.05           # KV blocks kept free beyond a prompt's own, for decode growth
    max_engine_waiting: int = 2                 # release only while the engine's own queue is below this
    # Prompt tokens the engine may hold queued or part-prefilled (Capacity.pending_prefill_tokens):
    # a request is released only while pending + its prompt fits (a longer prompt only when nothing is
    # pending). It bounds the prefill a newcomer's prefill queues behind or shares a step with, which
    # is what its TTFT costs beyond its own prefill. None = a quarter of the engine's max_num_tokens.
    max_pending_prefill_tokens: int | None = None
    headroom_fraction: float = 0.2              # sequence slots kept for light tenants while one is active
    headroom_window_s: float = 10.0             # how long after a light arrival the headroom is kept
    # On an engine that cannot preempt (trtllm): the headroom is kept at all times, also from a tenant
    # alone, so a tenant arriving at a node another one filled finds a slot (false: only in the window).
    headroom_without_preemption: bool = True
    # On an engine that can (reference, sim): a tenant owed a slot (nothing running, or under its weighted
    # share by one) that waits while another holds more than its share gets one: the over-served
    # tenant's newest sequence yields it (preempted, recomputed later; at most one per engine step).
    fairness_preemption: bool = True
    poll_interval_s: float = 0.005              # capacity re-check while blocked, in loop (wall) seconds
    early_refusal: bool = True                  # refuse at once when the estimated wait exceeds the budget
    early_refusal_fraction: float = 0.5         # ... times this: the estimate is noisy, and a refusal now
                                                # costs the client less than a drop after waiting

    def ttl_s(self, cls: PriorityClass) -> float:
        return {PriorityClass.INTERACTIVE: self.interactive_ttl_s, PriorityClass.STANDARD: self.standard_ttl_s,
                PriorityClass.BATCH: self.batch_ttl_s}[cls]

    def reserved_share(self, cls: PriorityClass) -> float:
        return {PriorityClass.INTERACTIVE: 0.0, PriorityClass.STANDARD: self.standard_reserved_share,
                PriorityClass.BATCH: self.batch_reserved_share}[cls]


DEFAULT_TENANT = TenantConfig()


class TenantRegistry:
    """Configured tenants by name, with the default for names the config does not list.

    Immutable after construction: a config reload builds a new one.
    """

    def __init__(self, tenants: Mapping[str, TenantConfig] | None = None,
                 default: TenantConfig | None = None, *, shared: bool = True) -> None:
        """`shared`: requests may come from more than one tenant (False: every request is the anonymous
        tenant's, auth mode "none"; see inferd.tenancy.Tenancy)."""
        tenants = dict(tenants or {})
        # `[tenants.default]` configures every tenant the config does not name.
        self.default = default or tenants.pop("default", None) or DEFAULT_TENANT
        self._tenants = tenants
        self.shared = shared

    def get(self, name: str) -> TenantConfig:
        return self._tenants.get(name, self.default)

    def label(self, name: str) -> str:
        """Metric label: bounded to configured tenants (plus `local`), everything else is `other`."""
        return name if name in self._tenants or name == LOCAL_TENANT else OTHER_LABEL

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tenants)


# -- semantic checks: `path: problem` lines for the config loader --------------------------


def auth_errors(auth: AuthConfig, path: str = "auth") -> list[str]:
    errors = []
    if auth.keys_file == "":
        errors.append(f"{path}.keys_file: must not be empty")
    if not TENANT_NAME_RE.match(auth.anonymous_tenant):
        errors.append(f"{path}.anonymous_tenant: must match {TENANT_NAME_RE.pattern}")
    if auth.static_key_sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", auth.static_key_sha256):
        errors.append(f"{path}.static_key_sha256: expected the key's SHA-256 as 64 lowercase hex digits "
                      "(e.g. from `printf %s KEY | sha256sum`)")
    return errors


_RETENTION_RE = re.compile(r"^(\d+(?:\.\d+)?)([dhm])$")
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0}


def retention_seconds(value: str) -> float:
    """"none" -> 0; "7d" / "12h" / "30m" -> seconds; ValueError otherwise."""
    if value == "none":
        return 0.0
    m = _RETENTION_RE.match(value)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f'expected "none" or a period such as "7d", "12h" or "30m", got {value!r}')
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def tenant_errors(name: str, t: TenantConfig, path: str = "tenants") -> list[str]:
    p = f"{path}.{name}"
    errors = []
    if not TENANT_NAME_RE.match(name):
        errors.append(f"{p}: tenant name must match {TENANT_NAME_RE.pattern}")
    if not t.weight > 0:
        errors.append(f"{p}.weight: must be > 0, got {t.weight}")
    try:
        retention_seconds(t.retention)
    except ValueError as exc:
        errors.append(f"{p}.retention: {exc}")
    for key in ("requests_per_minute", "tokens_per_minute", "max_prompt_tokens", "max_output_tokens",
                "max_kv_tokens_in_flight", "max_spend", "max_tokens_per_day"):
        value = getattr(t, key)
        if value is not None and value <= 0:
            errors.append(f"{p}.{key}: must be > 0 (omit it for no limit), got {value}")
    if t.max_concurrent_requests is not None and t.max_concurrent_requests <= 0:
        errors.append(f"{p}.max_concurrent_requests: must be > 0 (omit it for 64), got {t.max_concurrent_requests}")
    for key in ("max_queued_requests", "max_queued_tokens", "max_request_timeout_s",
                "max_stored_file_bytes", "max_concurrent_uploads"):
        if getattr(t, key) <= 0:
            errors.append(f"{p}.{key}: must be > 0, got {getattr(t, key)}")
    if not 0 < t.budget_warn_fraction <= 1:
        errors.append(f"{p}.budget_warn_fraction: must be in (0, 1], got {t.budget_warn_fraction}")
    if not t.allowed_models:
        errors.append(f'{p}.allowed_models: must name at least one model (or "*")')
    return errors


def admission_errors(a: AdmissionConfig, path: str = "admission") -> list[str]:
    errors = []
    for key in ("prompt_cost_weight", "output_cost_weight", "interactive_ttl_s", "standard_ttl_s",
                "batch_ttl_s", "max_queued_requests", "max_queued_tokens", "max_engine_waiting",
                "poll_interval_s"):
        if getattr(a, key) <= 0:
            errors.append(f"{path}.{key}: must be > 0, got {getattr(a, key)}")
    if a.max_pending_prefill_tokens is not None and a.max_pending_prefill_tokens <= 0:
        errors.append(f"{path}.max_pending_prefill_tokens: must be > 0 (omit it for a quarter of the engine's "
                      f"max_num_tokens), got {a.max_pending_prefill_tokens}")
    if not 0 < a.early_refusal_fraction <= 1:
        errors.append(f"{path}.early_refusal_fraction: must be in (0, 1], got {a.early_refusal_fraction}")
    for key in ("standard_reserved_share", "batch_reserved_share", "kv_reserve_fraction", "headroom_fraction"):
        if not 0 <= getattr(a, key) < 1:
            errors.append(f"{path}.{key}: must be in [0, 1), got {getattr(a, key)}")
    if a.standard_reserved_share + a.batch_reserved_share >= 1:
        errors.append(f"{path}: standard_reserved_share + batch_reserved_share must be < 1")
    return errors


class InsecureBindError(Exception):
    """Auth is off on an address other machines can reach, and the config did not say so on purpose."""


def bind_errors(path: str, check: Callable[[], None]) -> list[str]:
    """`check`'s InsecureBindError as one `path: message` line for the config loader (empty if none)."""
    try:
        check()
    except InsecureBindError as exc:
        return [f"{path}: {exc}"]
    return []


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_auth_binding(auth: AuthConfig, host: str) -> None:
    """Refuse `auth.mode = "none"` on a non-loopback address unless explicitly allowed.

    Call at startup and on every reload, with the address the server binds.
    """
    if auth.mode == "none" and not is_loopback(host) and not auth.allow_unauthenticated_non_loopback:
        raise InsecureBindError(
            f"server.host = {host!r} is not a loopback address but auth.mode = \"none\": every client "
            "could use this server as tenant "
            f"{auth.anonymous_tenant!r}. Set auth.mode = \"api_key\" (and create keys with "
            "`inferd keys create`), or set auth.allow_unauthenticated_non_loopback = true if that is intended."
        )
