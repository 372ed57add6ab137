"""The console's Models view: routes and their splits, each version's state (and residency under a memory
budget), rollouts with their phase and last decision's reason, and circuit breakers."""
from __future__ import annotations

from aiohttp import web

from inferd.api import appkeys as keys
from inferd.api.console import pages


def _routes(state) -> tuple[list, list]:
    routes, versions = [], []
    for m in state.registry.list_models():
        if m.kind == "version":
            versions.append((m.id, m.state or "-"))
            continue
        split = ", ".join(f"{pages.esc(a.target)} {a.weight:.0%}{'' if a.ready else ' (not ready)'}" for a in m.split)
        shadow = f"{pages.esc(m.shadow)} ({m.shadow_fraction:.0%})" if m.shadow else "-"
        routes.append([pages.esc(m.id), m.kind, split or "-", shadow, "yes" if m.routable else "no"])
    return routes, versions


async def render(request: web.Request, session, sessions) -> str:
    state = request.app[keys.STATE]
    routes, versions = _routes(state)
    lifecycle = getattr(state, "lifecycle", None)
    resident = lifecycle.snapshot()["versions"] if lifecycle is not None else None    # under a memory budget
    versions = [[pages.esc(vid), pages.esc(st), *(() if resident is None else (
        pages.esc(resident[vid]["state"]) if vid in resident else "-",))] for vid, st in versions]
    rollouts = [[pages.esc(r.name), pages.esc(r.phase), f"{pages.esc(r.stable)} -> {pages.esc(r.candidate)}",
                 f"step {r.step + 1} of {len(r.steps)}, candidate {r.candidate_weight:.0%}",
                 pages.esc(r.reason or "-")] for r in state.control.rollouts.states()]
    breakers = [[pages.esc(f"{b.model}@{b.version}"), pages.esc(b.state),
                 pages.esc(", ".join(f"{k}: {n}" for k, n in sorted(b.transitions.items())) or "-")]
                for b in state.control.breakers.snapshot()]
    body = (pages.table(("route", "kind", "split", "shadow", "routable"), routes, empty="No routes.")
            + "<h3>Versions</h3>" + pages.table(
                ("version", "state", *(("residency",) if lifecycle is not None else ())), versions,
                empty="No version loaded.")
            + "<h3>Rollouts</h3>" + pages.table(("route", "phase", "from -> to", "progress", "last decision, why"),
                                                rollouts, empty="No rollout.")
            + "<h3>Circuit breakers</h3>" + pages.table(("version", "state", "transitions"), breakers,
                                                        empty="No breaker configured."))
    return pages.page("Models", body, view="models", logout_token=sessions.form_token(session))
