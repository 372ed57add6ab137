"""The penalties and filters of OpenAI's sampling (`presence_penalty`, `frequency_penalty`, `logit_bias`) and
vLLM's extensions (`top_k`, `min_p`, `repetition_penalty`): their wire types and ranges.

The ranges are OpenAI's and vLLM's, the ones every engine checks (inferd.engine.validation); what each
parameter does is vLLM's sampler's (inferd.engine.reference.sampler). /openapi.json states them too
(inferd.api.routes.openapi), including LOGIT_BIAS_KEY.
"""
from __future__ import annotations

import re
from typing import Annotated

import msgspec

from inferd.api.errors import invalid
from inferd.engine import LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS, PENALTY_RANGE

Penalty = Annotated[float, msgspec.Meta(ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])]
TopK = Annotated[int, msgspec.Meta(ge=-1)]                  # vLLM's: -1 or 0 = no top-k filter
MinP = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
RepetitionPenalty = Annotated[float, msgspec.Meta(gt=0.0)]
# A token id spelled canonically: "07" and "7" would be one token twice, and a longer number is no token.
_KEY = re.compile(r"0|[1-9][0-9]{0,9}")
LOGIT_BIAS_KEY = f"^({_KEY.pattern})$"          # as a JSON Schema pattern


def parse_logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token id -> bias as (id, bias) pairs by id, or a 400 naming `logit_bias`. Whether
    each id is in the model's vocabulary is its engine's check (at submit, also a 400)."""
    if not bias:
        return ()
    if len(bias) > MAX_LOGIT_BIAS:
        raise invalid(f"logit_bias: at most {MAX_LOGIT_BIAS} token ids, got {len(bias)}.", param="logit_bias",
                      code="invalid_value")
    low, high = LOGIT_BIAS_RANGE
    pairs = []
    for key, value in bias.items():
        if not _KEY.fullmatch(key):
            shown = key if len(key) <= 20 else key[:17] + "..."
            raise invalid(f"logit_bias: keys are token ids (non-negative integers as strings), got {shown!r}.",
                          param="logit_bias", code="invalid_value")
        if not low <= value <= high:          # NaN and infinities fail too
            raise invalid(f"logit_bias: the bias of token {key} must be in [{low:g}, {high:g}], got {value:g}.",
                          param="logit_bias", code="invalid_value")
        pairs.append((int(key), float(value)))
    return tuple(sorted(pairs))
