"""The `[cluster]` table: peers that gossip over UDP, spill work to each other and share tenant quotas.

Without the table nothing of the cluster runs (docs/cluster.md). Only the table and its checks live
here; inferd.cluster does the rest. Every setting reloads on SIGHUP except the gossip socket
(`bind_host`, `bind_port`, `advertise_host`) and `node_id`, which need a restart.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

import msgspec

from inferd.config.walk import ConfigTable

NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\[\]-]{0,63}$")
DNS_LABEL_RE = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
DEAD_CLAIMS_PROBES = 100     # probe intervals a member's claims may still circulate (membership's reap of left ones)
RESTART_ONLY = ("bind_host", "bind_port", "advertise_host", "node_id")


class ClusterConfig(ConfigTable):
    node_id: str | None = None             # default: advertise_host:bind_port
    bind_host: str = "127.0.0.1"            # the gossip socket (UDP)
    bind_port: int = 7946
    advertise_host: str | None = None      # the address peers reach this node at (default: bind_host)
    http_url: str | None = None            # where peers forward requests (default: this node's listener)
    # "host:port" of gossip sockets to join through; host is an IP or a DNS name (resolved off the loop
    # at join and at every re-join, so a name may follow the seeds as they move).
    seeds: tuple[str, ...] = ()
    # The cluster's keys, one a line (64+ hex digits; or one raw key of 32+ bytes): the first encrypts
    # every datagram (AES-256-GCM) and signs forwarded requests' identity; every one is accepted. A
    # SIGHUP re-reads it; a key that left the file is still accepted for key_grace_s. Rotate in three
    # reloads (add the new key second, move it first, remove the old: docs/cluster.md).
    key_file: str = ""
    key_grace_s: float = 60.0
    timestamp_window_s: float = 30.0       # datagrams sent longer ago (or in the future) are dropped
    # SWIM failure detection (HashiCorp memberlist's defaults for a LAN, scaled by probe_interval_s).
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 0.5
    indirect_probes: int = 3
    suspicion_mult: float = 4.0            # suspicion timeout = mult * log10(max(n, 1)) * probe_interval
    suspicion_max_mult: float = 6.0        # ... up to this times that, shrinking as suspicions are confirmed
    retransmit_mult: int = 4               # an update piggybacks on mult * ceil(log10(n + 1)) datagrams
    gossip_interval_s: float = 0.2         # pending updates also go to gossip_nodes random peers this often
    gossip_nodes: int = 3
    sync_interval_s: float = 30.0          # full push-pull with one random member, dead included (anti-entropy)
    # Partition healing (as Serf does it): a dead member stays known for reconnect_timeout_s, and every
    # reconnect_interval_s this node push-pulls with one random dead member and re-joins every seed
    # that is not a live member, so two sides that each declared the other dead find each other again.
    reconnect_interval_s: float = 10.0
    reconnect_timeout_s: float = 86400.0
    # Load hints: each node sends its own to every peer this often; older than max age they are ignored.
    load_interval_s: float = 0.5
    load_max_age_s: float = 3.0
    # Spillover: forward to a peer with room when the node would refuse the request, or its estimated
    # local wait exceeds half of the request's TTFT budget: the tightest `ttft` SLO threshold on its
    # model, else spill_wait_s (docs/cluster.md#spillover); one hop, only to a peer whose own wait is
    # within that. 0.5 s: an interactive first-token target, against a forward's few milliseconds on a
    # LAN. The peer must answer with headers within forward_timeout_s.
    spillover: bool = True
    spill_wait_s: float = 0.5
    forward_timeout_s: float = 5.0
    # Tenant RPM/TPM limits are cluster-wide: each node takes a share in proportion to its recent demand.
    shared_quotas: bool = True
    shared_concurrency: bool = False       # also split max_concurrent_requests that way


def cluster_errors(c: ClusterConfig, path: str = "cluster") -> list[str]:
    errors: list[str] = []
    if not c.key_file:
        errors.append(f"{path}.key_file: required (a file with the cluster's keys, one a line, at least 64 hex "
                      "digits each)")
    for key in ("bind_host", "advertise_host"):
        value = getattr(c, key)
        if value is not None and not _is_ip(value):
            errors.append(f"{path}.{key}: expected an IP address, got {value!r}")
    if c.advertise_host is None and c.bind_host in ("0.0.0.0", "::"):
        errors.append(f"{path}.advertise_host: required when bind_host is {c.bind_host!r} (peers need an address)")
    if not 0 <= c.bind_port <= 65535:
        errors.append(f"{path}.bind_port: must be in 0..65535 (0 = any free port), got {c.bind_port}")
    if c.node_id is not None and not NODE_ID_RE.match(c.node_id):
        errors.append(f"{path}.node_id: must match {NODE_ID_RE.pattern}, got {c.node_id!r}")
    if c.http_url is not None and not c.http_url.startswith(("http://", "https://")):
        errors.append(f"{path}.http_url: expected an http:// or https:// URL, got {c.http_url!r}")
    for i, seed in enumerate(c.seeds):
        if parse_seed(seed) is None:
            errors.append(f"{path}.seeds[{i}]: expected \"host:port\" with an IP address or a DNS name, "
                          f"got {seed!r}")
    for key in ("key_grace_s", "timestamp_window_s", "probe_interval_s", "probe_timeout_s", "suspicion_mult",
                "gossip_interval_s", "sync_interval_s", "load_interval_s", "load_max_age_s", "spill_wait_s",
                "reconnect_interval_s", "reconnect_timeout_s", "forward_timeout_s", "indirect_probes",
                "retransmit_mult", "gossip_nodes"):
        if not getattr(c, key) > 0:
            errors.append(f"{path}.{key}: must be > 0, got {getattr(c, key)}")
    if c.probe_timeout_s >= c.probe_interval_s:
        errors.append(f"{path}.probe_timeout_s: must be shorter than probe_interval_s ({c.probe_interval_s})")
    if not c.suspicion_max_mult >= 1:
        errors.append(f"{path}.suspicion_max_mult: must be >= 1, got {c.suspicion_max_mult}")
    if not c.load_max_age_s > c.load_interval_s:
        errors.append(f"{path}.load_max_age_s: must be longer than load_interval_s ({c.load_interval_s})")
    # Forgotten sooner, a dead member would come back from old alive claims still circulating (they
    # piggyback for up to 100 probe intervals), and a partition longer than that would not heal.
    least = max(c.reconnect_interval_s, DEAD_CLAIMS_PROBES * c.probe_interval_s)
    if c.reconnect_timeout_s > 0 and c.reconnect_timeout_s < least:
        errors.append(f"{path}.reconnect_timeout_s: must be at least {least:g} (reconnect_interval_s and "
                      f"{DEAD_CLAIMS_PROBES} probe intervals), got {c.reconnect_timeout_s:g}")
    return errors


def parse_address(text: str) -> tuple[str, int] | None:
    """("10.0.0.2", 7946) from "10.0.0.2:7946" or "[::1]:7946"; None if malformed."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535 or not _is_ip(host):
        return None
    return host, int(port)


def parse_seed(text: str) -> tuple[str, int] | None:
    """("10.0.0.2", 7946) or ("seeds.example.internal", 7946) from a seed "host:port" ("[::1]:7946" too):
    the host an IP address or a DNS name (RFC 1123 labels; resolved later); None if malformed."""
    if (parsed := parse_address(text)) is not None:
        return parsed
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535 or not _is_dns_name(host):
        return None
    return host, int(port)


def resolve_cluster_paths(c: ClusterConfig, resolve: Callable[[str], str]) -> ClusterConfig:
    return msgspec.structs.replace(c, key_file=resolve(c.key_file) if c.key_file else "")


def _is_dns_name(text: str) -> bool:
    name = text.removesuffix(".")
    return 0 < len(name) <= 253 and all(DNS_LABEL_RE.match(label) for label in name.split(".")) \
        and not name.rsplit(".", 1)[-1].isdigit()        # "10.0.0" is a malformed IP, not a name


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
