"""The cluster's series (inferd.cluster), built at scrape time from its plain counters.

Registered by inferd.observability.metrics.Metrics; `source()` returns the live Cluster or None (a
single node: no series at all). Label values come from fixed sets: member states, rejection reasons,
push-pull reasons, spillover outcomes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

SPILL_OUTCOMES = ("forwarded", "forwarded_cold", "peer_failed", "no_peer", "ran_locally")


class ClusterCollector:
    def __init__(self, source: Callable[[], Any]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        cluster = self._source()
        if cluster is None or cluster.stats is None:
            return
        stats = cluster.stats
        members = GaugeMetricFamily("inferd_cluster_members", "Cluster members by state as this node sees them "
                                    "(itself included)", labels=("state",))
        for state, n in cluster.counts().items():
            members.add_metric((state,), n)
        yield members
        yield CounterMetricFamily("inferd_cluster_packets_sent", "Gossip datagrams sent", value=stats.sent)
        yield CounterMetricFamily("inferd_cluster_packets_received", "Gossip datagrams received (those dropped "
                                  "are also counted in inferd_cluster_packets_rejected_total)", value=stats.received)
        rejected = CounterMetricFamily("inferd_cluster_packets_rejected", "Gossip datagrams dropped, by reason "
                                       "(forged, altered, under an unknown key or for another node: bad_mac; "
                                       "naming no receiver but not a join: unaddressed; replayed: replay; "
                                       "outside the timestamp window: stale)", labels=("reason",))
        for reason, n in stats.rejected.items():        # every reason inferd.cluster.wire has, from zero
            rejected.add_metric((reason,), n)
        yield rejected
        probes = CounterMetricFamily("inferd_cluster_probes", "SWIM probes sent, by kind", labels=("kind",))
        probes.add_metric(("direct",), stats.probes)
        probes.add_metric(("indirect",), stats.indirect_probes)
        yield probes
        yield CounterMetricFamily("inferd_cluster_probe_failures", "Probes that got no ack, direct or indirect "
                                  "(the member became suspect)", value=stats.probe_failures)
        # GossipStats' buckets are cumulative already (acked probes at or under each bound).
        buckets = [(repr(float(b)), stats.probe_rtt_buckets[b]) for b in sorted(stats.probe_rtt_buckets)]
        buckets.append(("+Inf", stats.probe_rtt_count))
        yield HistogramMetricFamily("inferd_cluster_probe_rtt_seconds", "Round trip of acked direct probes",
                                    buckets=buckets, sum_value=stats.probe_rtt_sum_s)
        yield CounterMetricFamily("inferd_cluster_suspicions", "Members this node came to hold suspect (its own "
                                  "failed probes or other members' claims)", value=stats.suspicions)
        yield CounterMetricFamily("inferd_cluster_refutations", "Claims that this node was suspect or dead that it "
                                  "refuted (raising its incarnation)", value=stats.refutations)
        yield CounterMetricFamily("inferd_cluster_deaths", "Members this node declared dead (their suspicion timed "
                                  "out here)", value=stats.deaths)
        yield GaugeMetricFamily("inferd_cluster_broadcast_queue", "Membership claims waiting to be piggybacked",
                                value=cluster.queue_depth())
        push_pulls = CounterMetricFamily("inferd_cluster_push_pulls", "Full member-table exchanges this node "
                                         "started, by reason (join: a seed; periodic: sync_interval_s; reconnect: "
                                         "a dead member; new_member: one heard of from a third node)",
                                         labels=("reason",))
        for reason, n in stats.push_pulls.items():
            push_pulls.add_metric((reason,), n)
        yield push_pulls
        spills = CounterMetricFamily("inferd_cluster_spillovers", "Requests this node would have queued long or "
                                     "refused, by what happened: forwarded to a peer, forwarded to a peer that "
                                     "had loaded a model this node had not (forwarded_cold), a peer failed before "
                                     "answering, no peer had room, ran here after peers failed",
                                     labels=("outcome",))
        for outcome in SPILL_OUTCOMES:
            spills.add_metric((outcome,), cluster.spillovers.get(outcome, 0))
        yield spills

