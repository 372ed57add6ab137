"""The TOML config: one frozen struct per table, the strict walk that names every bad key, cross-table checks."""
from __future__ import annotations

from inferd.config.adapters import served_adapters
from inferd.config.aliases import ROUTE_NAME_RE, Arm, RoutingConfigError, Split, parse_target, split_from_config
from inferd.config.cluster import RESTART_ONLY as CLUSTER_RESTART_ONLY
from inferd.config.cache import CacheConfig
from inferd.config.cluster import ClusterConfig, parse_address, parse_seed
from inferd.config.policies import InputRules, OutputRules, PolicyConfig
from inferd.config.resilience import BreakerConfig, DegradeConfig
from inferd.config.rollouts import PriceConfig, RolloutConfig, RolloutThresholds, price_for, rollout_errors
from inferd.config.root import (
    AUDIT_FILE,
    DEFAULT_REFERENCE_KV_BLOCKS,
    DEFAULT_STATE_DIR,
    KEYS_FILE,
    Config,
    ConfigError,
    ModelConfig,
    ServerConfig,
    SimConfig,
    TrtllmConfig,
    TorchConfig,
    artifact_name,
    check_config_main,
    load_config,
    parse_config,
    with_overrides,
)
from inferd.config.front import resolve_front_processes
from inferd.config.embeddings import DEFAULT_LATENCY_TARGET_MS, BatchingConfig, latency_targets
from inferd.config.slos import LATENCY_SLIS, SloConfig
from inferd.config.state_dir import default_state_dir
from inferd.config.store import DB_FILE, StoreConfig
from inferd.config.tenants import (
    CLASSES_BY_RANK,
    DEFAULT_TENANT,
    TENANT_NAME_RE,
    AdmissionConfig,
    AuthConfig,
    InsecureBindError,
    PriorityClass,
    TenantConfig,
    TenantRegistry,
    check_auth_binding,
)
from inferd.config.tls import TlsConfig, check_tls_binding
from inferd.config.tracing import TracingConfig

__all__ = [
    "served_adapters",
    "AUDIT_FILE", "AdmissionConfig", "CacheConfig", "Arm", "AuthConfig", "BreakerConfig", "DegradeConfig", "CLASSES_BY_RANK", "CLUSTER_RESTART_ONLY", "ClusterConfig",
    "BatchingConfig", "Config", "ConfigError", "DEFAULT_LATENCY_TARGET_MS",
    "DB_FILE", "DEFAULT_REFERENCE_KV_BLOCKS", "DEFAULT_STATE_DIR", "InputRules", "InsecureBindError",
    "KEYS_FILE", "ModelConfig", "OutputRules", "PolicyConfig", "PriceConfig", "PriorityClass", "ROUTE_NAME_RE", "RolloutConfig", "RolloutThresholds",
    "RoutingConfigError", "ServerConfig", "SloConfig", "LATENCY_SLIS", "latency_targets",
    "SimConfig", "Split", "StoreConfig", "TENANT_NAME_RE", "TenantConfig",
    "DEFAULT_TENANT", "TenantRegistry", "TlsConfig", "TracingConfig", "TrtllmConfig", "TorchConfig", "artifact_name", "check_auth_binding", "check_config_main",
    "check_tls_binding", "default_state_dir", "load_config", "parse_config", "parse_address", "parse_seed", "parse_target", "price_for", "rollout_errors", "resolve_front_processes",
    "split_from_config", "with_overrides",
]
