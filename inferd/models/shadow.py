"""Shadow traffic: mirror a live request to another version at the lowest priority, discard its output.

A shadow copy never takes capacity from live traffic:
- it is submitted only when the shadow engine has spare room *above a reserve* (free sequence
  slots, which count requests waiting inside the engine, and KV blocks for its prompt and output); otherwise it
  is dropped at once, never queued;
- when a live request is about to go to an engine whose room is short, every shadow running there
  is aborted first (`make_room`), so a live request never waits behind a shadow.
(The admission queue has no class below `batch` and no "spare room only" mode, so shadows bypass
it with these two rules instead.)

Its output is consumed here and thrown away; only its outcome, latency and token counts reach the
`ShadowRecorder`, apart from live stats, so shadows never feed a rollout's judgement.
"""
from __future__ import annotations

import asyncio
import secrets

from inferd.engine import Engine, EngineError
from inferd.models.version_stats import ShadowRecorder
from inferd.observability import get_logger
from inferd.types import Delta, FinishReason, GenerationRequest, ModelVersion, SamplingParams

log = get_logger("inferd.shadow")

RESERVE_SLOTS = 1            # sequence slots always left for live traffic
RESERVE_BLOCK_FRACTION = 0.1  # share of KV blocks always left for live traffic


class _Running:
    __slots__ = ("key", "engine", "request_id", "task", "aborted")

    def __init__(self, key: ModelVersion, engine: Engine, request_id: str) -> None:
        self.key, self.engine, self.request_id = key, engine, request_id
        self.task: asyncio.Task[None] | None = None
        self.aborted = False


class ShadowDispatcher:
    def __init__(self, recorder: ShadowRecorder, *, reserve_slots: int = RESERVE_SLOTS,
                 reserve_block_fraction: float = RESERVE_BLOCK_FRACTION) -> None:
        self.recorder = recorder
        self.reserve_slots = reserve_slots
        self.reserve_block_fraction = reserve_block_fraction
        self._running: dict[str, _Running] = {}

    @property
    def running(self) -> int:
        return len(self._running)

    def _spare(self, engine: Engine, prompt_len: int, max_tokens: int) -> bool:
        cap = engine.capacity()
        need_blocks = -(-(prompt_len + max_tokens) // max(1, cap.block_size))
        reserve_blocks = int(engine.info.num_kv_blocks * self.reserve_block_fraction)
        return cap.free_slots > self.reserve_slots and cap.free_kv_blocks >= need_blocks + reserve_blocks

    def mirror(self, key: ModelVersion, engine: Engine, prompt_ids: tuple[int, ...] | list[int],
               sampling: SamplingParams, tenant: str = "local") -> bool:
        """Submit a shadow copy if `engine` has spare room; else count it dropped. Never raises."""
        if not engine.healthy or not self._spare(engine, len(prompt_ids), sampling.max_tokens):
            self.recorder.dropped(key)
            return False
        rid = "shadow-" + secrets.token_hex(12)
        try:
            stream = engine.submit(GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt_ids),
                                                     sampling=sampling, tenant=tenant))
        except EngineError:
            self.recorder.dropped(key)   # the prompt does not fit this version, or it is going away
            return False
        self.recorder.mirrored(key)
        run = _Running(key, engine, rid)
        self._running[rid] = run
        run.task = asyncio.get_running_loop().create_task(self._consume(run, stream), name=rid)
        return True

    async def _consume(self, run: _Running, stream) -> None:
        last: Delta | None = None
        try:
            last = await stream.collect()          # the output goes nowhere: only its numbers count
        except Exception as exc:  # noqa: BLE001
            log.warning("shadow_failed", version=str(run.key), error=str(exc))
        finally:
            self._running.pop(run.request_id, None)
            stream.cancel()
        if run.aborted or last is None or last.finish_reason in (FinishReason.ABORT, FinishReason.DEADLINE):
            if not run.aborted:
                self.recorder.dropped(run.key)   # aborted by a close or drain, not by us: no evidence
            return
        ok = last.finish_reason is not FinishReason.ERROR
        usage, timing = last.usage, last.timing
        ttft = itl = None
        if timing is not None and timing.first_token is not None:
            ttft = timing.first_token - timing.submitted
            n = usage.completion_tokens if usage else 0
            if n > 1 and timing.finished is not None:
                itl = (timing.finished - timing.first_token) / (n - 1)
        self.recorder.record(run.key, ok, ttft, itl, usage.prompt_tokens if usage else 0,
                             usage.completion_tokens if usage else 0)

    def make_room(self, engine: Engine, prompt_len: int, max_tokens: int) -> int:
        """A live request is about to go to `engine`: if its room is short (no spare above the
        reserve), abort every shadow running there. Returns how many were aborted."""
        shadows = [r for r in self._running.values() if r.engine is engine and not r.aborted]
        if not shadows or self._spare(engine, prompt_len, max_tokens):
            return 0
        for run in shadows:
            run.aborted = True
            self.recorder.dropped(run.key)
            engine.abort(run.request_id)
        return len(shadows)

    async def close(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        for run in list(self._running.values()):
            run.aborted = True
            run.engine.abort(run.request_id)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
