"""A tenant's view of the registry: every series, less those whose `tenant` label names another tenant.

A `metrics`-scope key of one tenant scrapes /metrics; its tenant's own per-tenant series (requests, tokens,
admission waits...) are its business, another tenant's are not. Node-wide series (no `tenant` label: engine,
KV cache, model latency) stay: they describe the node, not a customer. Filtering the collected samples, not
the rendered text, keeps label values (which may hold any character, escaped) out of the question.
"""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

TENANT_LABEL = "tenant"


class TenantView:
    """A collector over `registry` for exposition (generate_latest takes anything with `collect`): samples
    with no tenant label, and those of `tenant` (None: no tenant's, for a caller whose series are pooled)."""

    def __init__(self, registry: CollectorRegistry, tenant: str | None) -> None:
        self._registry = registry
        self._tenant = tenant

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            kept = [s for s in family.samples if s.labels.get(TENANT_LABEL, self._tenant) == self._tenant
                    and (self._tenant is not None or TENANT_LABEL not in s.labels)]
            if len(kept) == len(family.samples):
                yield family
                continue
            if not kept:
                continue                # a per-tenant family with none of this tenant's series: not named at all
            view = Metric(family.name, family.documentation, family.type, family.unit)
            view.samples = kept
            yield view
