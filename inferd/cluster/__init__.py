"""Peers: SWIM membership over authenticated UDP, load hints, spillover to peers with room, cluster-wide quotas."""
from __future__ import annotations
