"""Pluggable safety classifiers: Python entry points in the `inferd.safety` group.

An operator's package declares, in its pyproject.toml:

    [project.entry-points."inferd.safety"]
    llama-guard = "my_guard:LlamaGuard"

and a policy names it: `[policies.strict.input] classifiers = ["llama-guard"]`. The entry point is a
class (or any callable) taking no arguments, made once per daemon, whose instances have

    async def check(self, text: str, *, stage: str, tenant: str) -> str | None

`stage` is "input" (the prompt or messages) or "output" (a chunk of generated text, with the last
sent characters before it for context; `[policies.<name>.output] classify_every_chars`). Return
None to let the text through, or a short label of what was found (e.g. "S1: violent crimes"): it
is counted and audited, never the text. `check` runs on the event loop: await network calls, and
run CPU-heavy models in a thread (`await asyncio.to_thread(...)`). Policies fail closed: on the
input, a classifier that raises refuses the request with 503 `classifier_unavailable` (logged by
its name and error type only, never its message) and one still running at the request's deadline
is cancelled and the request answered 504; on the output, either ends the stream with an error.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

GROUP = "inferd.safety"


class SafetyClassifier(Protocol):
    async def check(self, text: str, *, stage: str, tenant: str) -> str | None: ...


class ClassifierError(Exception):
    """An entry point that cannot be loaded or built."""


class ClassifierFailed(Exception):
    """A classifier raised or ran past the request's deadline; only its name and the error's type are kept
    (the message of a plugin's exception may quote the text it was judging)."""

    def __init__(self, name: str, *, timed_out: bool = False, error_type: str | None = None) -> None:
        super().__init__(f"safety classifier {name!r} " + ("ran past the request's deadline" if timed_out
                                                           else f"failed ({error_type})"))
        self.name, self.timed_out, self.error_type = name, timed_out, error_type


def load_classifiers(names: Iterable[str]) -> dict[str, Any]:
    """Instances of the named entry points; ClassifierError naming the first that fails."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    out = {}
    for name in names:
        if name in out:
            continue
        ep = found.get(name)
        if ep is None:
            raise ClassifierError(f"no entry point {name!r} in the {GROUP!r} group")
        try:
            out[name] = ep.load()()
        except Exception as exc:  # noqa: BLE001 - an operator's plugin: say which and why
            raise ClassifierError(f"safety classifier {name!r} ({ep.value}) failed to load: {exc}") from exc
        if not callable(getattr(out[name], "check", None)):
            raise ClassifierError(f"safety classifier {name!r} ({ep.value}) has no check() method")
    return out
