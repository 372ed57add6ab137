"""The request path's side of safety policies (inferd.safety): the input check and the output filter.

The input check runs after the cheap refusals (auth, quota, size, length bound) and before the
prompt is tokenized: regexes and words first, then classifiers. A match is a 400 `content_filter`
naming the policy and the rule, never the text. The output filter wraps each admitted stream of a
tenant whose policy has output rules. Both count in inferd_safety_actions_total and write an audit
record (policy, rule, request id, model: no text).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from inferd.api.errors import INVALID_REQUEST, SERVER_ERROR, TIMEOUT, ApiError
from inferd.api.wire.endpoints import ENDPOINTS
from inferd.api.wire.openai import Prepared
from inferd.api.state import ServerState
from inferd.engine import Engine
from inferd.observability import get_logger
from inferd.safety import ClassifiedStream, ClassifierFailed, FilteredStream, Policy, RuleMatch, Verdict

log = get_logger("inferd.api")
THREAD_ABOVE_CHARS = 16_384     # longer inputs are decoded and searched in a thread: the loop serves others


def input_text(prepared: Prepared, engine: Engine) -> str:
    """Everything the model will read, as text: messages' contents, or the prompt (token ids decoded)."""
    if prepared.messages is not None:
        parts = []
        for message in prepared.messages:
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        return "\n".join(parts)
    if prepared.prompt_text is not None:
        return prepared.prompt_text
    if prepared.prompt_token_ids is not None:
        return engine.tokenizer.decode(prepared.prompt_token_ids)
    return ""


async def check_input(state: ServerState, tenant: str, prepared: Prepared, engine: Engine, model: str,
                      request_id: str, deadline: float) -> Policy | None:
    """The tenant's policy (None: none), after its input rules passed; ApiError 400 when they did not
    (503/504 when a classifier failed or ran out of time). Runs after tokenizing: token ids are valid."""
    policy = state.safety.for_tenant(tenant)
    if policy is None or not (policy.input or policy.classifiers):
        return policy
    for part in prepared.prompts():
        if part.prompt_chars > THREAD_ABOVE_CHARS or part.prompt_token_ids is not None:   # decode + regexes: long
            text, verdict = await asyncio.to_thread(_text_and_match, policy, part, engine)
        else:
            text, verdict = _text_and_match(policy, part, engine)
        if verdict is None and policy.classifiers:
            try:
                verdict = await policy.classify_input(text, tenant, deadline - time.monotonic())
            except ClassifierFailed as exc:
                log.warning("safety_classifier_failed", classifier=exc.name, timed_out=exc.timed_out,
                            error_type=exc.error_type)
                if exc.timed_out:
                    raise ApiError(504, "The request's deadline passed while its content was being checked.",
                                   type=TIMEOUT, code="deadline_exceeded") from None
                raise ApiError(503, f"The content policy `{policy.name}` could not check the request; retry later.",
                               type=SERVER_ERROR, code="classifier_unavailable", headers={"Retry-After": "1"}) from None
        if verdict is not None:
            _record(state, tenant, policy.name, verdict.rule, "input", request_id, model)
            field = ENDPOINTS[prepared.kind].prompt_field
            raise ApiError(400, f"The request was refused by the content policy `{policy.name}` ({verdict.rule}).",
                           type=INVALID_REQUEST, param=field, code="content_filter")
    return policy


def _text_and_match(policy: Policy, part: Prepared, engine: Engine) -> tuple[str, Verdict | None]:
    text = input_text(part, engine)
    return text, policy.match_input(text)


def filter_output(state: ServerState, policy: Policy | None, streams: list[Any], tenant: str,
                  prompt_ids: list[list[int]], request_id: str, model: str) -> list[Any]:
    """`streams` (one per prompt of `prompt_ids`), each behind the policy's output filter when it has
    output rules."""
    if policy is None or not (policy.output or policy.output_classifiers):
        return streams

    def stopped(match: RuleMatch) -> None:
        _record(state, tenant, policy.name, match.rule, "output", request_id, model)

    def flagged(label: str) -> None:
        _record(state, tenant, policy.name, label, "output", request_id, model)

    out = []
    for stream, ids in zip(streams, prompt_ids):
        if policy.output:
            stream = FilteredStream(stream, policy.output, policy.hold_back_chars, len(ids), stopped)
        if policy.output_classifiers:
            stream = ClassifiedStream(stream, policy.output_classify(tenant), policy.classify_every_chars,
                                      policy.classifier_timeout_s, len(ids), flagged)
        out.append(stream)
    return out


def _record(state: ServerState, tenant: str, policy: str, rule: str, stage: str, request_id: str, model: str) -> None:
    state.metrics.count_safety_action(state.tenancy.tenants.label(tenant), policy, stage)
    state.control.audit.append(tenant, f"safety.{stage}_{'refused' if stage == 'input' else 'stopped'}",
                               target=tenant, detail={"policy": policy, "rule": rule, "request_id": request_id,
                                                      "model": model})
