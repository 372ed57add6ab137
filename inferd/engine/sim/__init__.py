"""The simulated engine (a timed GPU simulator, never a silent fallback): profiles, scheduler, engine."""
from __future__ import annotations

from inferd.engine.sim.encoder import SimEncoder, sim_embedding_engine
from inferd.engine.sim.engine import SimEngine
from inferd.engine.sim.profiles import PROFILES, get_profile
from inferd.engine.sim.speculation import SimSpeculation

__all__ = ["PROFILES", "SimEncoder", "SimEngine", "SimSpeculation", "get_profile", "sim_embedding_engine"]
