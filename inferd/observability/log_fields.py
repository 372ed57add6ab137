"""What every log format shares: the request id of the task logging, and the fields never written as given."""
from __future__ import annotations

import contextvars

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("inferd_request_id", default=None)

# Field names that could hold user text. Redacted, never written (design: logs never carry
# prompt or completion text unless a tenant's retention setting asks for it).
TEXT_FIELDS = frozenset({
    "prompt", "prompts", "messages", "content", "completion", "text", "output", "input",
    "body", "stop",
})
REDACTED = "[redacted]"


def logged_value(key: str, value: object) -> object:
    """What a log line (any format) writes for a field: the value, or REDACTED where the name says user text."""
    return REDACTED if key in TEXT_FIELDS else value
