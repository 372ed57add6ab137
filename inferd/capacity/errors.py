"""The capacity planner's typed errors: every one is a message for the operator, never a traceback."""
from __future__ import annotations


class CapacityError(Exception):
    """Anything `inferd capacity` refuses; the CLI prints it and exits 2."""


class DemandError(CapacityError):
    """The demand description is missing a value or has one out of range (the message names it)."""


class CurvesError(CapacityError):
    """A measured-curves file does not match the schema (the message names the field, as a path)."""


class SloUnreachable(CapacityError):
    """No replica count of this profile can meet the SLO: adding replicas shortens neither a step nor a
    prefill, so the answer is another profile (or a looser SLO), not more GPUs."""

    def __init__(self, profile: str, reason: str) -> None:
        super().__init__(f"{profile}: {reason}")
        self.profile = profile
        self.reason = reason
