"""SimScheduler on hand-made sequences: no engine, no loop, no time."""
from __future__ import annotations

import random

from inferd.engine.base import Capacity, blocks_for
from inferd.engine.sim.scheduler import SimScheduler, SimSequence
from inferd.engine.stream import RequestStream


def seq(name: str, prompt_len: int, max_tokens: int = 100) -> SimSequence:
    return SimSequence(name, RequestStream(name), [0] * prompt_len, max_tokens, key=0, stop_ids=frozenset(),
                       eos_threshold=0, matcher=None)


def scheduler(**kwargs) -> SimScheduler:
    limits = dict(num_kv_blocks=16, block_size=4, max_batch_size=4, max_num_tokens=32) | kwargs
    return SimScheduler(**limits)


def step(sched: SimScheduler) -> list[tuple[str, int]]:
    """Schedule, 'run' and complete one step, each finished prefill or decode yielding one token."""
    plan = sched.schedule()
    sched.computed(plan)
    for s, _ in plan.scheduled:
        if s.num_computed == s.prompt_len + len(s.output):
            s.token_ids.append(1)
    return [(s.request_id, n) for s, n in plan.scheduled]


def test_waiting_sequences_start_in_order_within_the_token_budget() -> None:
    sched = scheduler(max_num_tokens=12)
    for name, n in (("a", 5), ("b", 5), ("c", 5)):
        sched.add(seq(name, n))
    assert step(sched) == [("a", 5), ("b", 5), ("c", 2)]     # c starts with the 2 tokens left
    assert step(sched) == [("a", 1), ("b", 1), ("c", 3)]     # decodes first, then the rest of c
    assert [s.request_id for s in sched.running] == ["a", "b", "c"] and not sched.waiting


def test_a_long_prompt_prefills_in_chunks_of_the_budget() -> None:
    sched = scheduler(max_num_tokens=8)
    sched.add(seq("long", 20))
    assert [step(sched) for _ in range(4)] == [[("long", 8)], [("long", 8)], [("long", 4)], [("long", 1)]]


def test_out_of_blocks_preempts_the_newest_which_recomputes_from_the_head_of_waiting() -> None:
    sched = scheduler(num_kv_blocks=4, block_size=4)
    sched.add(seq("old", 7))
    sched.add(seq("new", 7))
    step(sched)                       # 2 blocks each: the pool is full
    step(sched)                       # 8 tokens each: still 2 blocks
    step(sched)                       # the 9th needs a third block: the newest gives way
    assert sched.preemptions == 1 and [s.request_id for s in sched.running] == ["old"]
    assert sched.waiting[0].request_id == "new" and sched.waiting[0].num_computed == 0
    assert sched.free_blocks + sum(s.blocks for s in sched.running) == 4


def test_capacity_reserves_what_waiting_sequences_need_and_remove_gives_everything_back() -> None:
    sched = scheduler()
    a, b = seq("a", 9), seq("b", 6)
    sched.add(a)
    sched.add(b)
    cap = sched.capacity()
    assert (cap.free_kv_blocks, cap.waiting, cap.free_slots, cap.pending_prefill_tokens) == (16 - 3 - 2, 2, 2, 15)
    step(sched)
    cap = sched.capacity()
    assert (cap.free_kv_blocks, cap.waiting, cap.pending_prefill_tokens) == (11, 0, 0)
    for s in (a, b):
        s.done = True
        sched.remove(s)
    assert sched.capacity().free_kv_blocks == 16 and not sched.has_work()


def capacity_from_scratch(sched: SimScheduler) -> Capacity:
    """What SimScheduler.capacity must say, summed over every sequence as it stands."""
    bs, reserved, pending = sched.block_size, 0, 0
    for s in sched.waiting:
        reserved += blocks_for(s.num_tokens, bs)
        pending += s.num_tokens - s.num_computed_tokens
    for s in sched.running:
        left = s.num_tokens - s.num_computed_tokens
        pending += left if left > 1 or s.num_tokens == s.num_prompt_tokens else 0
        if s.num_computed_tokens < s.num_prompt_tokens:
            reserved += blocks_for(s.num_prompt_tokens, bs) - len(s.block_table)
    free = max(0, sched.free_blocks - reserved)
    parked = list(sched._scheduler.parked)
    return Capacity(free_kv_blocks=free, free_kv_tokens=free * bs, waiting=len(sched.waiting), block_size=bs,
                    free_slots=max(0, sched.max_batch_size - len(sched.running) - len(sched.waiting)),
                    pending_prefill_tokens=pending, parked=len(parked),
                    parked_kv_blocks=sum(blocks_for(s.num_tokens, bs) for s in parked))


def test_capacity_read_between_any_changes_is_what_every_sequence_sums_to() -> None:
    # The running sequences' part is kept from step to step: adds, ends (mid-prefill too), parks and mid-step
    # reads must still give what a pass over every sequence gives (never more room than there is).
    rng = random.Random(5)
    sched = scheduler(num_kv_blocks=40, block_size=4, max_batch_size=6, max_num_tokens=8)
    live: list[SimSequence] = []
    for i in range(600):
        op, running = rng.random(), list(sched.running)
        if op < 0.25:
            live.append(seq(f"s{i}", rng.randint(1, 30), max_tokens=rng.randint(1, 12)))
            sched.add(live[-1])
        elif op < 0.4 and live:
            gone = rng.choice(running) if running and rng.random() < 0.7 else rng.choice(live)
            live.remove(gone)
            gone.done = True
            sched.remove(gone)
        elif op < 0.45 and running:
            sched.park(rng.choice(running))
        elif sched.has_work():
            plan = sched.schedule()
            assert sched.capacity() == capacity_from_scratch(sched)      # read while the step runs
            sched.computed(plan)
            for s, _ in plan.scheduled:
                if s.num_computed == s.prompt_len + len(s.output) and s in sched.running:
                    s.token_ids.append(1)
                    if len(s.output) >= s.max_tokens:      # it ends on its last token, as the engine's do
                        live.remove(s)
                        s.done = True
                        sched.remove(s)
        assert sched.capacity() == capacity_from_scratch(sched), f"operation {i}"
