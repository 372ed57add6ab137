"""Scheduler with no model: token budget, batch size, chunked prefill, preemption, recompute.

A fake paged "model" writes token ids into a flat KV array by slot mapping and derives the next
token from what it reads back through the block table, so any mistake in block tables, slots,
prefix reuse or recompute changes the outputs.
"""
from __future__ import annotations

import numpy as np

from inferd.engine.block_manager import BlockManager
from inferd.engine.scheduler import Scheduler, SchedulerOutput
from inferd.engine.sequence import Sequence, SequenceStatus, prefix_salt
from inferd.types import FinishReason, SamplingParams

BS = 4


class FakePagedModel:
    def __init__(self, num_blocks: int) -> None:
        self.kv = np.full(num_blocks * BS, -1, dtype=np.int64)

    def forward(self, out: SchedulerOutput) -> list[int]:
        for src, dst in out.block_copies:       # forks: copied before anything is written or read
            self.kv[dst * BS:(dst + 1) * BS] = self.kv[src * BS:(src + 1) * BS]
        self.kv[out.slot_mapping] = out.token_ids
        tokens = []
        for table, ctx in zip(out.block_tables, out.context_lens):
            pos = np.arange(ctx)
            context = self.kv[np.asarray(table)[pos // BS] * BS + pos % BS]
            tokens.append(int((context * (pos + 1)).sum() % 97) + 3)
        return tokens


def make(num_blocks=64, max_batch_size=8, max_num_tokens=64, max_model_len=256, eos=()):
    bm = BlockManager(num_blocks, BS)
    return Scheduler(bm, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                     max_model_len=max_model_len, eos_token_ids=eos), FakePagedModel(num_blocks)


def new_seq(rid, prompt, max_tokens=8, **kw) -> Sequence:
    return Sequence(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw),
                    salt=prefix_salt("t"))


def step(sched: Scheduler, model: FakePagedModel) -> SchedulerOutput:
    out = sched.schedule()
    if not out.empty:
        logits = model.forward(out)
        sched.update_from_output(out, [logits[r] for r in out.sample_rows])
    return out


def run_all(sched, model, seqs, max_steps=500) -> dict[str, list[int]]:
    for s in seqs:
        sched.add(s)
    for _ in range(max_steps):
        if not sched.has_work():
            break
        step(sched, model)
    assert not sched.has_work()
    return {s.request_id: s.completion_token_ids for s in seqs}


def prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(1, 50, size=n).tolist() for n in (5, 13, 3, 9, 17, 8)]


def solo_outputs(max_tokens=8):
    outs = {}
    for i, p in enumerate(prompts()):
        sched, model = make()
        outs.update(run_all(sched, model, [new_seq(f"r{i}", p, max_tokens)]))
    return outs


def test_step_packs_decodes_before_prefill_within_the_token_budget():
    sched, model = make(max_num_tokens=16)
    a, b, c = new_seq("a", range(1, 11)), new_seq("b", range(2, 12)), new_seq("c", range(1, 4))
    for s in (a, b, c):
        sched.add(s)
    out = step(sched, model)
    assert [s.request_id for s in out.seqs] == ["a", "b"]
    assert out.num_new_tokens == [10, 6] and out.num_tokens == 16
    assert out.sample_rows == [0]           # b's first chunk yields no token
    out = step(sched, model)
    # a decodes first (1 token), then b's remaining 4 prompt tokens, then c's 3
    assert [s.request_id for s in out.seqs] == ["a", "b", "c"]
    assert out.num_new_tokens == [1, 4, 3] and out.sample_rows == [0, 1, 2]


def test_max_batch_size_caps_running_sequences():
    sched, model = make(max_batch_size=2)
    seqs = [new_seq(f"r{i}", [i + 1] * 3) for i in range(4)]
    for s in seqs:
        sched.add(s)
    out = step(sched, model)
    assert len(out.seqs) == 2 and len(sched.running) == 2 and len(sched.waiting) == 2


def test_chunked_prefill_positions_and_slots_follow_the_block_table():
    sched, model = make(max_num_tokens=6)
    s = new_seq("long", range(1, 15))       # 14 tokens: chunks of 6, 6, 2
    sched.add(s)
    chunks = []
    for _ in range(3):
        out = step(sched, model)
        table = np.asarray(s.block_table)
        assert (out.slot_mapping == table[out.positions // BS] * BS + out.positions % BS).all()
        chunks.append((out.positions.tolist(), out.token_ids.tolist(), out.sample_rows))
    assert chunks[0] == (list(range(0, 6)), list(range(1, 7)), [])
    assert chunks[1] == (list(range(6, 12)), list(range(7, 13)), [])
    assert chunks[2] == ([12, 13], [13, 14], [0])
    assert s.num_completion_tokens == 1


def test_batched_outputs_equal_solo_outputs():
    sched, model = make(max_num_tokens=10, max_batch_size=4)
    seqs = [new_seq(f"r{i}", p) for i, p in enumerate(prompts())]
    assert run_all(sched, model, seqs) == solo_outputs()


def test_finishes_on_max_tokens_eos_and_stop_token_and_frees_blocks():
    sched, model = make(eos=(7,))
    s = new_seq("len", [1, 2, 3], max_tokens=3)
    run_all(sched, model, [s])
    assert s.finish_reason is FinishReason.LENGTH and s.num_completion_tokens == 3
    first = s.completion_token_ids[0]
    sched2, model2 = make(eos=(first,))
    e = new_seq("eos", [1, 2, 3])
    run_all(sched2, model2, [e])
    assert e.finish_reason is FinishReason.STOP and e.completion_token_ids == [first]
    sched3, model3 = make(eos=(first,))
    ig = new_seq("ignore", [1, 2, 3], max_tokens=2, ignore_eos=True, stop_token_ids=(s.completion_token_ids[1],))
    run_all(sched3, model3, [ig])
    assert ig.finish_reason is FinishReason.STOP and ig.num_completion_tokens == 2
    for sc in (sched, sched2, sched3):
        assert sc.block_manager.num_used_blocks == 0


def test_max_model_len_ends_with_length():
    sched, model = make(max_model_len=6)
    s = new_seq("ctx", [1, 2, 3, 4], max_tokens=50)
    run_all(sched, model, [s])
    assert s.finish_reason is FinishReason.LENGTH and s.num_tokens == 6


def test_preempts_the_newest_running_sequence_when_blocks_run_out():
    sched, model = make(num_blocks=4, max_num_tokens=64)
    old, new = new_seq("old", range(1, 5), max_tokens=20), new_seq("new", range(11, 15), max_tokens=20)
    sched.add(old)
    sched.add(new)
    preempted = []
    for _ in range(6):
        out = step(sched, model)
        preempted += [p.request_id for p in out.preempted]
        if preempted:
            break
    assert preempted == ["new"]
    assert new.status is SequenceStatus.WAITING and new.block_table == [] and sched.waiting[0] is new
    assert new.num_completion_tokens > 0    # generated tokens are kept for the recompute
    assert old.status is SequenceStatus.RUNNING


def test_preempted_sequences_recompute_and_still_match_solo_outputs():
    prompts_ = prompts()
    sched, model = make(num_blocks=8, max_num_tokens=12, max_batch_size=6)
    seqs = [new_seq(f"r{i}", p, max_tokens=12) for i, p in enumerate(prompts_)]
    outs = run_all(sched, model, seqs)
    assert sched.num_preemptions > 0
    assert outs == solo_outputs(max_tokens=12)
    assert sched.block_manager.num_used_blocks == 0


def test_repeated_prompt_is_served_from_the_prefix_cache():
    sched, model = make()
    first = new_seq("a", range(1, 11))
    run_all(sched, model, [first])
    again = new_seq("b", range(1, 11))
    out_steps = []
    sched.add(again)
    out_steps.append(step(sched, model))
    assert again.num_cached_tokens == 8 and out_steps[0].num_new_tokens == [2]
    run_all(sched, model, [])
    assert again.completion_token_ids == first.completion_token_ids


def test_finish_removes_a_waiting_or_running_sequence_and_frees_its_blocks():
    sched, model = make()
    a, b = new_seq("a", range(1, 10)), new_seq("b", range(1, 10))
    sched.add(a)
    step(sched, model)
    sched.add(b)
    sched.finish(a, FinishReason.ABORT)
    sched.finish(b, FinishReason.ABORT)
    assert not sched.has_work() and sched.block_manager.num_used_blocks == 0
    assert a.finish_reason is FinishReason.ABORT and b.status is SequenceStatus.FINISHED


def test_an_identical_prompt_forks_once_the_first_computed_it_sharing_full_blocks_and_copying_the_last():
    sched, model = make()
    a, b = new_seq("a", range(10, 20)), new_seq("b", range(10, 20))     # 10 tokens: 2 full blocks + 2
    sched.add(a)
    sched.add(b)
    first = step(sched, model)
    assert first.seqs == [a] and first.num_new_tokens == [10]           # b waits for a's prompt
    second = step(sched, model)
    assert second.seqs == [a, b] and second.num_new_tokens == [1, 1]    # b computes only its last prompt token
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert second.block_copies == [(a.block_table[2], b.block_table[2])]
    assert b.num_cached_tokens == 9 and sched.num_forks == 1
    assert sched.block_manager.ref_counts[a.block_table[0]] == 2
    outputs = run_all(sched, model, [])
    alone, model2 = make()
    expected = run_all(alone, model2, [new_seq("c", range(10, 20))])["c"]
    assert a.completion_token_ids == b.completion_token_ids == expected and outputs == {}


def test_a_fork_at_a_block_boundary_copies_nothing():
    sched, model = make()
    a, b = new_seq("a", range(9)), new_seq("b", range(9))              # 8 tokens shared: 2 full blocks
    run = run_all(sched, model, [a, b])
    assert sched.num_forks == 1 and run["a"] == run["b"]


def test_prompts_of_other_tenants_or_that_differ_do_not_fork():
    sched, model = make()
    a, b, c = new_seq("a", range(10)), new_seq("b", range(10)), new_seq("c", [*range(9), 42])
    b.salt = prefix_salt("other")
    for s in (a, b, c):
        sched.add(s)
    assert step(sched, model).seqs == [a, b, c] and sched.num_forks == 0


def test_a_sequence_whose_leader_ended_starts_from_the_prefix_cache_instead():
    sched, model = make()
    a, b = new_seq("a", range(10), max_tokens=1), new_seq("b", range(10))
    sched.add(a)
    sched.add(b)
    step(sched, model)
    assert a.finished
    out = step(sched, model)
    assert out.seqs == [b] and out.num_new_tokens == [2] and sched.num_forks == 0


def test_a_parked_sequence_gives_up_its_slot_and_blocks_and_resumes_only_when_nothing_waits():
    sched, model = make(max_batch_size=2)
    a, b = new_seq("a", range(1, 10), max_tokens=20), new_seq("b", range(2, 11), max_tokens=20)
    sched.add(a)
    sched.add(b)
    step(sched, model)
    step(sched, model)
    assert sched.park(b) and not sched.park(b)          # a second park of the same: nothing held
    assert b.block_table == [] and b.num_completion_tokens > 0 and sched.running == [a]
    c = new_seq("c", range(3, 12), max_tokens=2)
    sched.add(c)
    out = step(sched, model)
    assert c in out.seqs and b not in out.seqs          # the newcomer takes the slot, not the parked one
    while not c.finished:
        step(sched, model)
    out = step(sched, model)                            # a slot is free and nothing waits: b resumes
    assert b in out.seqs and sched.num_parked == 1 and not sched.parked


def test_a_parked_sequence_recomputes_and_its_output_matches_an_unpreempted_run():
    sched, model = make(max_batch_size=2)
    seqs = [new_seq(f"r{i}", p, max_tokens=12) for i, p in enumerate(prompts()[:2])]
    for s in seqs:
        sched.add(s)
    for _ in range(6):
        step(sched, model)
    sched.park(seqs[1])
    other = new_seq("other", prompts()[2], max_tokens=3)
    outs = run_all(sched, model, [other])
    outs.update({s.request_id: s.completion_token_ids for s in seqs})
    assert {k: outs[k] for k in ("r0", "r1")} == {k: v for k, v in solo_outputs(12).items() if k in ("r0", "r1")}
    assert sched.block_manager.num_used_blocks == 0


def test_finish_removes_a_parked_sequence():
    sched, model = make()
    a = new_seq("a", range(1, 10))
    sched.add(a)
    step(sched, model)
    sched.park(a)
    sched.finish(a, FinishReason.ABORT)
    assert not sched.has_work() and a.finish_reason is FinishReason.ABORT


def test_a_draft_is_cut_to_the_step_budget_and_dropped_rather_than_preempt_anyone():
    from inferd.engine.block_manager import BlockManager
    from inferd.engine.scheduler import Scheduler
    from inferd.engine.sequence import Sequence

    bm = BlockManager(3, 4)
    sched = Scheduler(bm, max_batch_size=4, max_num_tokens=6, max_model_len=64)
    a, b = Sequence("a", list(range(1, 4))), Sequence("b", list(range(1, 5)))
    for seq in (a, b):
        sched.add(seq)
    out = sched.schedule()                    # both prefill: a 3 tokens (1 block), b 4 (1 block), 1 block free
    sched.update_from_output(out, [7, 7])     # a: 4 tokens, 3 computed; b: 5 tokens, 4 computed
    a.draft, b.draft = [1, 2, 3, 4, 5], [1, 2]
    out = sched.schedule()
    # a: its last token and 5 drafts would take 2 more blocks (1 free): its draft goes, nobody is preempted;
    # b then gets its last token and its 2 drafts within the 6-token budget
    assert out.num_new_tokens == [1, 3] and a.draft == [] and b.draft == [1, 2] and not out.preempted
    assert out.draft_rows == [1] and out.sample_rows == [0, 1]
