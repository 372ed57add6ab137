"""The daemon's TOML config, decoded into frozen msgspec structs.

Validation collects *every* problem before failing, so `inferd check-config` names all bad keys at
once instead of one per run: each table is walked field by field (unknown key, wrong type; the
generic walk is inferd.config.walk), then semantic checks run on what decoded (port range,
positive sizes, backend-specific sections; the tables other modules declare are checked against
the rest of the file in inferd.config.cross_checks).
Relative paths are resolved against the config file's directory, so the daemon behaves the same
whatever directory systemd or a user starts it from.
"""
from __future__ import annotations

import ipaddress
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec

from inferd import tomllib
from inferd.config.adapters import adapter_errors, resolve_adapters
from inferd.config.aliases import AliasConfig
from inferd.config.cache import CacheConfig, cache_errors
from inferd.config.cluster import ClusterConfig, cluster_errors, resolve_cluster_paths
from inferd.config.cross_checks import auth_binding_errors, routing_errors, tenancy_errors
from inferd.config.embeddings import BatchingConfig, Task, embedding_errors, with_batching_targets
from inferd.config.front import FrontProcesses, front_processes_errors
from inferd.config.policies import PolicyConfig
from inferd.config.resilience import BreakerConfig, DegradeConfig
from inferd.config.rollouts import PriceConfig, RolloutConfig
from inferd.config.slos import SloConfig
from inferd.config.store import StoreConfig, resolve_store_paths, store_errors
from inferd.config.tenants import AdmissionConfig, AuthConfig, TenantConfig
from inferd.config.speculative import SpeculativeConfig, speculative_errors
from inferd.config.torch_engine import TorchConfig, torch_errors
from inferd.config.tls import TlsConfig, resolve_tls_paths, tls_binding_errors, tls_errors
from inferd.config.tracing import TracingConfig, tracing_errors
from inferd.config.trust import trust_list_errors
from inferd.config.walk import ConfigTable, check_table, type_name, well_formed

Backend = Literal["reference", "torch", "sim", "trtllm"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["auto", "text", "json"]
SchedulerPolicy = Literal["guaranteed_no_evict", "max_utilization"]

# Served model names appear in URLs, metric labels and `name@version` routing: keep them plain.
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
PREWARM_AT_RE = re.compile(r"^(?:[01]\d|2[0-3]):[0-5]\d$")


class ServerConfig(ConfigTable):
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 1_048_576
    heartbeat_interval_s: float = 15.0
    # A finished stream's end waits this long for its client to acknowledge the content (inferd.api.streaming.
    # accepted); past it, the stream is not complete: recorded 499, billed what its client acknowledged.
    stream_ack_timeout_s: float = 10.0
    request_timeout_s: float = 600.0
    drain_grace_s: float = 30.0
    engines_root: str = "engines"
    # Runtime state (API keys, audit log): never loose in a checkout. Default: systemd's
    # $STATE_DIRECTORY (/var/lib/inferd), else ./state beside the config file (git-ignored).
    state_dir: str | None = None
    log_level: LogLevel = "info"
    # json: one JSON object per line (journald, files, pipes); text: lines for a person at a terminal
    # (inferd.observability.console); auto: text when stderr is a terminal. `serve --log-format` overrides it.
    log_format: LogFormat = "auto"
    # The listener's guards against slow or idle clients (inferd.daemon.listener); read per new connection.
    header_timeout_s: float = 10.0         # first byte of a request -> end of its headers
    body_timeout_s: float = 30.0           # end of the headers -> end of the body
    idle_timeout_s: float = 15.0           # an open connection with no request in progress (keep-alive)
    max_connections: int = 1024            # open connections serving any route
    probe_connections: int = 8             # beyond max_connections: accepted for /healthz, /readyz only
    # A tenant's requests refused as invalid, paced (inferd.tenancy.refusals): debt in body bytes paid off at
    # this rate (0: off), pacing only once the debt is over the burst.
    refused_bytes_per_s: float = 1_048_576.0
    refused_burst_bytes: int = 8_388_608
    # A memory budget for model versions (inferd.models.memory_budget). With one, versions load when first asked for
    # (or pinned / prewarmed) and the least recently used idle ones are evicted to make room; None: every
    # configured version loads at start and stays.
    model_memory_bytes: int | None = None
    min_residency_s: float = 60.0          # a version used this recently is not evicted (hysteresis)
    # HTTPS (inferd.config.tls); plain HTTP on a non-loopback host only when explicitly allowed.
    tls: TlsConfig | None = None
    allow_plaintext_non_loopback: bool = False
    # .pub files one of which must have signed every engine artifact (docs/artifacts.md); () = none.
    trusted_keys: tuple[str, ...] = ()
    # The most choices one request may ask for with `n` (each is an engine sequence): 1..16.
    max_n: int = 16
    # SSE writer processes (inferd.api.streaming.writers): plain-TCP streams are written by these after
    # their headers; 0: every stream is written by this process; "auto": from the usable CPUs
    # (inferd.config.front.resolve_front_processes, which says why).
    # "auto" by default: on an H200 node (16 cores) 4 writers delivered 1.08 of the torch engine's direct
    # tokens/s at 256 streams against 0.93 written in process (docs/performance.md, "SSE writer processes");
    # below 4 usable CPUs it is 0, as a writer would only take turns with the daemon on its core.
    front_processes: FrontProcesses = "auto"


class SimConfig(ConfigTable):
    profile: str = "llama3-8b-h100"
    time_scale: float = 1.0
    max_model_len: int = 8192
    seed: int = 0
    # Cold starts in the sim: start() takes the profile's load time (weights / load_bandwidth + setup)
    # x time_scale, as a real load would; off by default so existing sim configs start at once.
    simulate_load: bool = False


class TrtllmConfig(ConfigTable):
    engine_dir: str | None = None          # default: the artifact resolved under engines_root
    tokenizer_dir: str | None = None       # default: the engine directory
    kv_cache_free_gpu_memory_fraction: float | None = None
    kv_cache_max_tokens: int | None = None
    enable_block_reuse: bool = True
    scheduler_policy: SchedulerPolicy = "guaranteed_no_evict"
    enable_chunked_prefill: bool = True
    # TensorRT-LLM's logprobs need generation logits gathered for every request (a cost all pay): off, a
    # request with logprobs is a 400 naming it (docs/trtllm-api.md)
    gather_generation_logits: bool = False
    lora_adapters: dict[str, str] = {}    # adapter name -> directory (the older spelling of models.X.lora_adapters)


class ModelConfig(ConfigTable):
    backend: Backend = "reference"
    artifact: str | None = None            # default: the served model name (the table key)
    version: str = "latest"
    versions: tuple[str, ...] = ()         # further versions kept loaded and warm (docs/models.md)
    max_batch_size: int = 32
    max_num_tokens: int = 512
    # reference and torch on cpu: default 2048; torch on cuda: its share of the GPU; sim: the profile's
    num_kv_blocks: int | None = None
    # reference: the longest sequence (prompt + output) served, below the model's own context (vLLM's
    # --max-model-len); None: the model's max_position_embeddings (and never past the KV pool)
    max_model_len: int | None = None
    # max_tokens of a chat or Responses request that sets none (completions keep OpenAI's 16); None: the rest
    # of the context, which on a CPU model is minutes of decoding (the shipped config sets one)
    default_max_tokens: int | None = None
    block_size: int = 16
    verify: bool = True                    # reference: check artifact sha256s at start
    trusted_keys: tuple[str, ...] = ()     # when set, replaces server.trusted_keys for this model
    sim: SimConfig | None = None
    trtllm: TrtllmConfig | None = None
    torch: TorchConfig | None = None       # backend = "torch": device, dtype, memory (inferd.config.torch_engine)
    speculative: SpeculativeConfig | None = None   # draft and verify several tokens a step (inferd.config.speculative)
    breaker: BreakerConfig | None = None   # stop routing to a failing version for a while
    keep_warm_s: float = 0.0               # a version the config drops stays loaded, unrouted, this long
    hardware: str | None = None            # the `hardware` label of its autoscaling series (e.g. "h100-sxm");
    #                                        default: the sim profile's name, "cpu" (reference), "gpu" (trtllm)
    # LoRA adapters requests name as `model:adapter` (inferd.config.adapters; every backend)
    lora_adapters: dict[str, str] = {}      # adapter name -> PEFT directory or adapter artifact (sim: any, unread)
    max_loaded_adapters: int = 4            # reference: adapters resident at once (an LRU)
    adapter_idle_unload_s: float | None = None   # reference: unload after this long unused (None: only evicted)
    # Embedding models (inferd.config.embeddings): what it serves, and its dynamic batcher
    task: Task | None = None                # "generate" | "embed"; default: the artifact's (reference), else generate
    batching: BatchingConfig | None = None
    # Under a memory budget (server.model_memory_bytes): never evicted (loaded at start), loaded at start if it fits,
    # and the bytes it holds when loaded (default: estimated from its weights and KV pool)
    pinned: bool = False
    prewarm: bool = False
    prewarm_at: tuple[str, ...] = ()        # "HH:MM" (UTC), every day: loaded ahead of the traffic it expects
    memory_bytes: int | None = None


DEFAULT_REFERENCE_KV_BLOCKS = 2048


class AuditConfig(ConfigTable):
    """`[audit]`: the append-only log of routing and rollout changes (docs/models.md)."""

    path: str | None = None                # default: <server.state_dir>/audit.jsonl


def _default_models() -> dict[str, ModelConfig]:
    return {"small": ModelConfig()}


class Config(ConfigTable):
    """The whole file. An empty file means the defaults: the reference engine serving `small`."""

    server: ServerConfig = ServerConfig()
    models: dict[str, ModelConfig] = msgspec.field(default_factory=_default_models)
    aliases: dict[str, AliasConfig] = {}
    rollouts: dict[str, RolloutConfig] = {}
    prices: dict[str, PriceConfig] = {}
    audit: AuditConfig = AuditConfig()
    # Who may call (auth), per-tenant limits (tenants), the per-engine fair queue (admission).
    auth: AuthConfig = AuthConfig()
    tenants: dict[str, TenantConfig] = {}
    admission: AdmissionConfig = AdmissionConfig()
    # Peers (inferd.cluster); absent = a single node.
    cluster: ClusterConfig | None = None
    # Durable state (inferd.store): usage ledger, idempotency keys, files and batches.
    store: StoreConfig = StoreConfig()
    # Service level objectives (inferd.slo): burn rates, alert rules, dashboards.
    slos: dict[str, SloConfig] = {}
    degrade: dict[str, DegradeConfig] = {}
    tracing: TracingConfig | None = None    # OpenTelemetry spans per stage; absent = off
    policies: dict[str, PolicyConfig] = {}  # safety policies tenants are held to
    cache: CacheConfig = CacheConfig()      # the response cache tenants opt in to


class ConfigError(Exception):
    """An invalid config. `errors` holds one `path: problem` line per bad key."""

    def __init__(self, errors: list[str], source: str = "config") -> None:
        self.errors = list(errors)
        self.source = source
        super().__init__(f"{source}: {len(errors)} error(s):\n" + "\n".join(f"  {e}" for e in errors))

    def report(self) -> str:
        """What the command-line tools print: the file, then one bad key a line."""
        return f"{self.source}: invalid config, {len(self.errors)} error(s)\n" + "".join(f"  {e}\n" for e in self.errors)


# -- semantic pass -------------------------------------------------------------------------

# Tables of named entries (`[models.<name>]`, ...), checked one entry at a time so errors name it.
_ENTRY_TABLES = ("models", "aliases", "rollouts", "prices", "tenants", "slos", "degrade", "policies")


def _server_errors(s: ServerConfig) -> list[str]:
    errors: list[str] = []
    if s.host != "localhost":            # the one name accepted: it means loopback everywhere
        try:
            ipaddress.ip_address(s.host)
        except ValueError:
            errors.append(f"server.host: expected an IP address such as 127.0.0.1 (or localhost), got {s.host!r}")
    if not 0 <= s.port <= 65535:
        errors.append(f"server.port: must be in 0..65535 (0 = any free port), got {s.port}")
    for key in ("max_body_bytes", "heartbeat_interval_s", "stream_ack_timeout_s", "request_timeout_s",
                "header_timeout_s", "body_timeout_s", "idle_timeout_s", "max_connections"):
        if not getattr(s, key) > 0:   # `not >` also rejects NaN
            errors.append(f"server.{key}: must be > 0, got {getattr(s, key)}")
    for key in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
        if getattr(s, key) == float("inf"):
            errors.append(f"server.{key}: must be finite (it is what cuts a slow client), got inf")
    for key in ("probe_connections", "refused_bytes_per_s", "refused_burst_bytes"):
        if not getattr(s, key) >= 0:   # `not >=` also rejects NaN
            errors.append(f"server.{key}: must be >= 0, got {getattr(s, key)}")
    if s.model_memory_bytes is not None and s.model_memory_bytes <= 0:
        errors.append("server.model_memory_bytes: must be > 0 bytes (omit it for no budget), "
                      f"got {s.model_memory_bytes}")
    if not 0 <= s.min_residency_s < math.inf:
        errors.append(f"server.min_residency_s: must be >= 0 seconds, got {s.min_residency_s}")
    if s.refused_bytes_per_s == float("inf"):
        errors.append("server.refused_bytes_per_s: must be finite (0 turns pacing off), got inf")
    errors.extend(front_processes_errors(s.front_processes))
    if not 1 <= s.max_n <= 16:          # 16: the wire format's own cap (inferd.api.wire.openai.MAX_N)
        errors.append(f"server.max_n: must be in 1..16, got {s.max_n}")
    if s.drain_grace_s < 0:
        errors.append(f"server.drain_grace_s: must be >= 0, got {s.drain_grace_s}")
    if not s.engines_root:
        errors.append("server.engines_root: must not be empty")
    errors.extend(trust_list_errors("server.trusted_keys", s.trusted_keys))
    if s.tls is not None:
        errors.extend(tls_errors(s.tls))
    return errors


def _model_errors(name: str, m: ModelConfig) -> list[str]:
    p = f"models.{name}"
    errors = []
    if not MODEL_NAME_RE.match(name):
        errors.append(f"{p}: model name must match {MODEL_NAME_RE.pattern} (it is used in URLs and labels)")
    for key in ("max_batch_size", "max_num_tokens", "block_size"):
        if getattr(m, key) <= 0:
            errors.append(f"{p}.{key}: must be > 0, got {getattr(m, key)}")
    if m.num_kv_blocks is not None and m.num_kv_blocks <= 0:
        errors.append(f"{p}.num_kv_blocks: must be > 0, got {m.num_kv_blocks}")
    if m.default_max_tokens is not None and m.default_max_tokens <= 0:
        errors.append(f"{p}.default_max_tokens: must be > 0 tokens (omit it for the rest of the context), "
                      f"got {m.default_max_tokens}")
    if m.max_model_len is not None and m.max_model_len <= 0:
        errors.append(f"{p}.max_model_len: must be > 0 tokens, got {m.max_model_len}")
    if m.block_size > 0 and m.block_size & (m.block_size - 1):
        errors.append(f"{p}.block_size: must be a power of two, got {m.block_size}")
    if m.hardware is not None and not MODEL_NAME_RE.match(m.hardware):
        errors.append(f"{p}.hardware: a short label ({MODEL_NAME_RE.pattern}), got {m.hardware!r}")
    for i, at in enumerate(m.prewarm_at):
        if not PREWARM_AT_RE.match(at):
            errors.append(f"{p}.prewarm_at[{i}]: expected a UTC time of day as HH:MM, got {at!r}")
    if m.memory_bytes is not None and m.memory_bytes <= 0:
        errors.append(f"{p}.memory_bytes: must be > 0 bytes, got {m.memory_bytes}")
    if not 0 <= m.keep_warm_s < math.inf:
        errors.append(f"{p}.keep_warm_s: must be >= 0 seconds, got {m.keep_warm_s}")
    if m.artifact is not None and not m.artifact:
        errors.append(f"{p}.artifact: must not be empty")
    if not m.version:
        errors.append(f"{p}.version: must not be empty")
    for i, v in enumerate(m.versions):
        if not VERSION_RE.match(v) or v == "latest":
            errors.append(f"{p}.versions[{i}]: expected a version id such as 3f2a9c01d2e4, got {v!r}")
        elif v == m.version or v in m.versions[:i]:
            errors.append(f"{p}.versions[{i}]: version {v!r} is listed twice")
    errors.extend(trust_list_errors(f"{p}.trusted_keys", m.trusted_keys))
    errors.extend(adapter_errors(p, m))
    errors.extend(embedding_errors(p, m.backend, m.task, m.batching, m.lora_adapters))
    if m.sim is not None and m.backend != "sim":
        errors.append(f"{p}.sim: a [sim] section needs backend = \"sim\" (backend is {m.backend!r})")
    if m.trtllm is not None and m.backend != "trtllm":
        errors.append(f"{p}.trtllm: a [trtllm] section needs backend = \"trtllm\" (backend is {m.backend!r})")
    errors.extend(torch_errors(p, m.backend, m.torch))
    errors.extend(speculative_errors(p, m.backend, m.speculative))
    if m.speculative is not None and m.task == "embed":
        errors.append(f"{p}.speculative: an embedding model decodes no tokens to draft")
    if m.sim is not None:
        if not m.sim.time_scale >= 0:   # 0: no simulated step time (front-end benchmarks); rejects NaN
            errors.append(f"{p}.sim.time_scale: must be >= 0, got {m.sim.time_scale}")
        if m.sim.max_model_len <= 0:
            errors.append(f"{p}.sim.max_model_len: must be > 0, got {m.sim.max_model_len}")
        errors.extend(_sim_profile_errors(f"{p}.sim.profile", m.sim.profile))
    if m.trtllm is not None:
        t = m.trtllm
        frac = t.kv_cache_free_gpu_memory_fraction
        if frac is not None and not 0 < frac < 1:
            errors.append(f"{p}.trtllm.kv_cache_free_gpu_memory_fraction: must be in (0, 1), got {frac}")
        if t.kv_cache_max_tokens is not None and t.kv_cache_max_tokens <= 0:
            errors.append(f"{p}.trtllm.kv_cache_max_tokens: must be > 0, got {t.kv_cache_max_tokens}")
    return errors


def _sim_profile_errors(path: str, profile: str) -> list[str]:
    try:
        from inferd.engine.sim import PROFILES
    except ImportError:  # the sim module is optional at validation time; the factory reports it
        return []
    if profile not in PROFILES:
        return [f"{path}: unknown profile {profile!r} (known: {', '.join(sorted(PROFILES))})"]
    return []


# -- public API ----------------------------------------------------------------------------


def _resolve(base: Path, value: str) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


# Runtime state: beside the config file in DEFAULT_STATE_DIR unless server.state_dir or systemd says.
DEFAULT_STATE_DIR = "state"
KEYS_FILE = "keys.jsonl"
AUDIT_FILE = "audit.jsonl"


def _systemd_state_dir() -> str:
    """systemd's StateDirectory= (the unit sets StateDirectory=inferd: /var/lib/inferd), or ""."""
    return os.environ.get("STATE_DIRECTORY", "").split(":")[0]


def _with_state_files(cfg: Config, state: Path) -> Config:
    """Keys and audit files default to the state directory; paths given in the file are kept."""
    return msgspec.structs.replace(
        cfg, server=msgspec.structs.replace(cfg.server, state_dir=str(state)),
        audit=msgspec.structs.replace(cfg.audit, path=cfg.audit.path or str(state / AUDIT_FILE)),
        auth=msgspec.structs.replace(cfg.auth, keys_file=cfg.auth.keys_file or str(state / KEYS_FILE)),
        store=resolve_store_paths(cfg.store, lambda p: p, str(state)))


def _resolve_paths(cfg: Config, base: Path) -> Config:
    tls = cfg.server.tls
    tls = resolve_tls_paths(tls, lambda p: _resolve(base, p)) if tls is not None else None
    state = Path(_resolve(base, cfg.server.state_dir or _systemd_state_dir() or DEFAULT_STATE_DIR))
    server = msgspec.structs.replace(cfg.server, engines_root=_resolve(base, cfg.server.engines_root), tls=tls,
                                     trusted_keys=tuple(_resolve(base, k) for k in cfg.server.trusted_keys))
    models = {}
    for name, m in cfg.models.items():
        t = m.trtllm
        if t is not None:
            t = msgspec.structs.replace(
                t,
                engine_dir=_resolve(base, t.engine_dir) if t.engine_dir else None,
                tokenizer_dir=_resolve(base, t.tokenizer_dir) if t.tokenizer_dir else None,
                lora_adapters=resolve_adapters(t.lora_adapters, lambda v: _resolve(base, v)),
            )
        models[name] = msgspec.structs.replace(m, trtllm=t, trusted_keys=tuple(_resolve(base, k) for k in m.trusted_keys),
                                               lora_adapters=resolve_adapters(m.lora_adapters, lambda v: _resolve(base, v)))
    audit = msgspec.structs.replace(cfg.audit, path=_resolve(base, cfg.audit.path) if cfg.audit.path else None)
    auth = msgspec.structs.replace(
        cfg.auth, keys_file=_resolve(base, cfg.auth.keys_file) if cfg.auth.keys_file else None,
        secret_file=_resolve(base, cfg.auth.secret_file) if cfg.auth.secret_file else None)
    cluster = resolve_cluster_paths(cfg.cluster, lambda p: _resolve(base, p)) if cfg.cluster is not None else None
    store = msgspec.structs.replace(cfg.store, path=_resolve(base, cfg.store.path) if cfg.store.path else None)
    return _with_state_files(msgspec.structs.replace(cfg, server=server, models=models, audit=audit, auth=auth,
                                                     cluster=cluster, store=store), state)


def _besides(semantic: list[str], structural: list[str]) -> list[str]:
    """The semantic errors not about a key already reported malformed (that key took its default)."""
    bad = {e.split(":", 1)[0] for e in structural}
    return [e for e in semantic if e.split(":", 1)[0] not in bad]


def parse_config(raw: dict[str, Any], *, base_dir: Path | None = None, source: str = "config") -> Config:
    """Validate a decoded TOML document. Raises ConfigError listing every problem.

    Each table also gets its semantic checks, on the keys that decoded (walk.well_formed), so one run
    reports a mistyped key and an out-of-range value of the same table together.
    """
    errors: list[str] = []
    check_table(raw, Config, "", errors, skip=_ENTRY_TABLES)
    if isinstance(raw, dict):
        server = well_formed(raw.get("server", {}), ServerConfig)
        if server is not None:
            errors.extend(_besides(_server_errors(server) + tls_binding_errors(
                server.tls, server.host, server.allow_plaintext_non_loopback), errors))
        models = raw.get("models")
        if isinstance(models, dict):
            if not models:
                errors.append("models: at least one [models.<name>] table is required")
            for name, model in models.items():
                model_errors: list[str] = []
                check_table(model, ModelConfig, f"models.{name}", model_errors)
                errors.extend(model_errors)
                decoded = well_formed(model, ModelConfig)
                if decoded is not None:
                    errors.extend(_besides(_model_errors(name, decoded), model_errors))
        elif models is not None:
            errors.append(f"models: expected a table of models, got {type_name(models)}")
        cluster = well_formed(raw.get("cluster"), ClusterConfig) if raw.get("cluster") is not None else None
        if cluster is not None:
            errors.extend(_besides(cluster_errors(cluster), errors))
        tracing = well_formed(raw.get("tracing"), TracingConfig) if raw.get("tracing") is not None else None
        if tracing is not None:
            errors.extend(_besides(tracing_errors(tracing), errors))
        cache = well_formed(raw.get("cache", {}), CacheConfig)
        if cache is not None:
            errors.extend(_besides(cache_errors(cache), errors))
        store = well_formed(raw.get("store", {}), StoreConfig)
        if store is not None:
            errors.extend(_besides(store_errors(store), errors))
        routing_errors(raw, errors)
        tenancy_errors(raw, errors, server.host if server is not None else None)
    if errors:
        raise ConfigError(errors, source)
    try:
        cfg = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:  # the passes above should have caught it; never crash
        raise ConfigError([str(exc)], source) from None
    cfg = with_batching_targets(cfg)
    # No file (tests, embedders): paths stay as written; the keys and audit files' users default to ./state.
    return _resolve_paths(cfg, base_dir) if base_dir is not None else cfg


def load_config(path: str | Path) -> Config:
    """Read, decode and validate a TOML config file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"cannot read: {exc.strerror or exc}"], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"not UTF-8 text: {exc.reason}"], str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"TOML syntax: {exc}"], str(path)) from None
    return parse_config(raw, base_dir=path.resolve().parent, source=str(path))


def with_overrides(cfg: Config, *, host: str | None = None, port: int | None = None) -> Config:
    """Apply command-line overrides, re-checking what they touch."""
    server = msgspec.structs.replace(
        cfg.server,
        host=cfg.server.host if host is None else host,
        port=cfg.server.port if port is None else port,
    )
    out = msgspec.structs.replace(cfg, server=server)
    errors = [e for e in _server_errors(server) if e.startswith(("server.host", "server.port"))]
    if not errors:
        errors = (auth_binding_errors(cfg.auth, server.host)   # --host 0.0.0.0 with auth off or without TLS
                  + tls_binding_errors(server.tls, server.host, server.allow_plaintext_non_loopback))
    if errors:
        raise ConfigError(errors, "command line")
    return out


def artifact_name(name: str, model: ModelConfig) -> str:
    return model.artifact or name


def check_config_main(path: str, more_checks: Callable[[Config], list[str]] | None = None) -> int:
    """`inferd check-config PATH`: 0 when valid, 1 naming every bad key on stderr. `more_checks` (the
    daemon's preflight: artifacts, keys file) runs on a config that validated."""
    try:
        cfg = load_config(path)
        if more_checks is not None and (errors := more_checks(cfg)):
            raise ConfigError(errors, str(path))
    except ConfigError as exc:
        sys.stderr.write(exc.report())
        return 1
    models = ", ".join(f"{n} ({m.backend})" for n, m in cfg.models.items())
    tenants = ", ".join(cfg.tenants) or "none configured"
    print(f"{path}: ok; listens on {cfg.server.host}:{cfg.server.port}; models: {models}; "
          f"auth: {cfg.auth.mode}; tenants: {tenants}")
    return 0
