"""Peers: SWIM membership over encrypted UDP, load hints, spillover to peers with room, cluster-wide quotas."""
from __future__ import annotations

from inferd.cluster.identity import HEADER as FORWARDED_HEADER
from inferd.cluster.identity import TOKEN_TTL_S, ForwardedIdentity
from inferd.cluster.cluster import Cluster
from inferd.cluster.keyring import ClusterKeyError
from inferd.cluster.membership import Member
from inferd.cluster.wire import Rejected

__all__ = ["FORWARDED_HEADER", "TOKEN_TTL_S", "Cluster", "ClusterKeyError", "ForwardedIdentity", "Member", "Rejected"]
