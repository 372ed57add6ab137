"""inferd.engine.victims and the scheduler's KV preemption with tenants: the newest sequence of the tenant
holding the most blocks per weight gives its blocks up, also when this step had already scheduled it;
with one tenant, the newest, as before."""
from __future__ import annotations

from inferd.engine.sequence import Sequence, prefix_salt
from inferd.engine.victims import victim_index
from inferd.types import SamplingParams
from tests.engine.test_scheduler import make, run_all, step


def held(tenant: str, blocks: int, weight: float = 1.0) -> Sequence:
    seq = Sequence(f"{tenant}{blocks}", [1], tenant=tenant, weight=weight)
    seq.block_table = list(range(blocks))
    return seq


def tenant_seq(rid: str, tenant: str, prompt, max_tokens: int = 8, weight: float = 1.0) -> Sequence:
    return Sequence(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0),
                    salt=prefix_salt("t"), tenant=tenant, weight=weight)


def test_one_tenant_gives_up_its_newest_sequence():
    assert victim_index([held("a", 5), held("a", 1), held("a", 3)]) == 2
    assert victim_index([held("", 1), held("", 9)]) == 1


def test_the_tenant_holding_the_most_blocks_gives_up_its_newest_not_the_newest_overall():
    running = [held("beta", 6), held("beta", 5), held("alpha", 1), held("beta", 4), held("alpha", 2)]
    assert victim_index(running) == 3


def test_blocks_count_per_unit_of_weight():
    running = [held("alpha", 6, weight=3), held("beta", 3, weight=1), held("alpha", 1, weight=3)]
    assert victim_index(running) == 1          # beta 3 per weight, alpha 7/3
    running = [held("alpha", 6, weight=1), held("beta", 3, weight=1), held("alpha", 1, weight=1)]
    assert victim_index(running) == 2          # alpha 7, beta 3


def test_a_tie_goes_to_the_newest_sequences_tenant():
    assert victim_index([held("beta", 2), held("alpha", 2)]) == 1
    assert victim_index([held("alpha", 2), held("beta", 2)]) == 1


def test_a_light_tenants_sequence_keeps_running_and_the_heavy_ones_already_scheduled_sequence_goes():
    sched, model = make(num_blocks=3, max_num_tokens=64)
    beta = tenant_seq("b", "beta", range(1, 6), max_tokens=20)      # 2 blocks (room for 8 tokens)
    alpha = tenant_seq("a", "alpha", range(11, 15), max_tokens=20)  # 1 block, full after its prompt
    sched.add(beta)
    sched.add(alpha)
    step(sched, model)
    out = step(sched, model)       # beta's decode fits and is scheduled first; alpha's needs a block
    assert out.preempted == [beta] and out.seqs == [alpha] and out.num_new_tokens == [1]
    assert len(out.token_ids) == 1 and out.context_lens == [alpha.num_computed_tokens] == [5]
    assert out.kv_tokens == out.attention_pairs == 5 and beta.block_table == []
    assert sched.waiting[0] is beta                               # recomputed first, as before


def test_outputs_with_tenant_aware_preemption_match_unpreempted_runs():
    prompts = [list(range(1 + i, 9 + i)) for i in range(4)]
    tenants = ["beta", "beta", "alpha", "beta"]

    def seqs():
        return [tenant_seq(f"r{i}", t, p, max_tokens=12) for i, (t, p) in enumerate(zip(tenants, prompts))]

    sched, model = make(num_blocks=9, max_num_tokens=12, max_batch_size=4)
    outs = run_all(sched, model, seqs())
    assert sched.num_preemptions > 0 and sched.block_manager.num_used_blocks == 0
    solo = {}
    for seq in seqs():
        roomy, roomy_model = make()
        solo.update(run_all(roomy, roomy_model, [seq]))
    assert outs == solo
