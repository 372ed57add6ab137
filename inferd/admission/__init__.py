"""The weighted-fair admission queue in front of each engine: tickets, backlog, VTC order, capacity gate, estimates."""
from __future__ import annotations

from inferd.admission.fair_queue import AdmissionQueue, AdmissionRejected, AdmittedStream, QueueLoad
from inferd.admission.ticket import Lease, retry_after_header

__all__ = ["AdmissionQueue", "AdmissionRejected", "AdmittedStream", "Lease", "QueueLoad", "retry_after_header"]
