"""What every request struct of the wire shares: strict decoding, and the no-op-value rule with how a
refused value is shown back to the client."""
from __future__ import annotations

from typing import Any

import msgspec

# Unknown fields are errors (a 400 naming them); absent and default fields are left out when encoded.
STRICT = dict(forbid_unknown_fields=True, kw_only=True, omit_defaults=True)


def is_no_op(value: Any, allowed: tuple[Any, ...]) -> bool:
    """Whether `value` is absent or one of the `allowed` values that leave the output unchanged."""
    # bool is an int in Python: `echo: 0` must not pass as `false`, nor `n: true` as 1.
    return value is None or any(type(value) is type(a) and value == a for a in allowed) or (
        isinstance(value, float) and any(type(a) is int and value == a for a in allowed))


def show_value(value: Any) -> str:
    """`value` as JSON for an error message, cut to 60 characters."""
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."
