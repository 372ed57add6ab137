"""StepInputs: a SchedulerOutput as device tensors, and the real scheduler driving the torch decoder."""
from __future__ import annotations

import numpy as np
import pytest

from tests.hf_checkpoints import save_checkpoint, torch

from tests.engine.torch.steps import Chunk, scheduler_output

from inferd.engine.block_manager import BlockManager
from inferd.engine.scheduler import Scheduler
from inferd.engine.sequence import Sequence
from inferd.engine.torch.inputs import StepInputs, StepInputsError
from inferd.engine.torch.model import TorchLlama
from inferd.types import SamplingParams

BLOCK = 4


def test_a_mixed_step_splits_into_decode_rows_and_prefill_spans():
    chunks = [Chunk([1, 2, 3, 4, 5], [7, 2]), Chunk([6, 7, 8], [4], start=2), Chunk([9] * 10, [0, 1, 3], start=6),
              Chunk([5, 5], [6], start=1)]
    out = scheduler_output(chunks, BLOCK)

    step = StepInputs.build(out, "cpu")

    assert step.token_ids.tolist() == out.token_ids.tolist() and step.token_ids.dtype == torch.int64
    assert step.slot_mapping.tolist() == out.slot_mapping.tolist()
    assert step.positions.tolist() == [0, 1, 2, 3, 4, 2, 6, 7, 8, 9, 1]
    assert step.last_rows.tolist() == [4, 5, 9, 10]
    assert step.decode_rows.tolist() == [5, 10]
    assert step.decode_block_tables.dtype == step.decode_context_lens.dtype == torch.int32
    assert step.decode_block_tables.tolist() == [[4], [6]] and step.decode_context_lens.tolist() == [3, 2]
    assert [(s.start, s.end, s.context_len, s.blocks.tolist()) for s in step.prefill] == [
        (0, 5, 5, [7, 2]), (6, 10, 10, [0, 1, 3])]
    assert (step.max_token_id, step.max_block_id, step.max_slot) == (9, 7, max(out.slot_mapping))


def test_a_decode_only_step_attends_every_row_at_once_with_0_padded_tables():
    step = StepInputs.build(scheduler_output([Chunk([1, 2], [3], 1), Chunk([1] * 9, [5, 0, 2], 8)], BLOCK), "cpu")
    assert step.decode_rows is None and step.prefill == []
    assert step.decode_block_tables.tolist() == [[3, 0, 0], [5, 0, 2]]


@pytest.mark.parametrize("change, message", [
    (lambda out: out.context_lens.pop(), "one entry per sequence"),
    (lambda out: setattr(out, "token_ids", out.token_ids[:-1]), "token_ids must be 3 integers"),
    (lambda out: out.context_lens.__setitem__(0, 1), "num_new_tokens <= context_len"),
    (lambda out: out.block_tables.__setitem__(0, [-1]), ">= 0"),
])
def test_inconsistent_scheduler_arrays_are_refused(change, message):
    out = scheduler_output([Chunk([1, 2, 3], [0])], BLOCK)
    change(out)
    with pytest.raises(StepInputsError, match=message):
        StepInputs.build(out, "cpu")
    with pytest.raises(StepInputsError, match="loras"):
        StepInputs.build(scheduler_output([Chunk([1, 2, 3], [0])], BLOCK), "cpu", [None, None])


def test_the_scheduler_driving_the_decoder_reproduces_transformers_greedy_continuations(tmp_path):
    """Chunked prefill (a token budget of 8), prefix caching (two prompts share 2 blocks) and decode rows beside
    prefill chunks, all from the real Scheduler and BlockManager."""
    hf = save_checkpoint(tmp_path, "tinyllama", seed=2)
    model = TorchLlama.from_pretrained(tmp_path, device="cpu", dtype=torch.float32)
    pool = model.new_kv_pool(num_blocks=32, block_size=BLOCK)
    scheduler = Scheduler(BlockManager(32, BLOCK), max_batch_size=4, max_num_tokens=8, max_model_len=64)
    prompts = [[257, 84, 82, 68, 81, 198, 71, 127, 102, 75, 75], [257, 84, 82, 68, 81, 198, 71, 127, 30, 31],
               [5, 6, 7]]
    seqs = [Sequence(str(i), p, SamplingParams(max_tokens=6, temperature=0.0)) for i, p in enumerate(prompts)]
    for seq in seqs:
        scheduler.add(seq)
    while scheduler.has_work():
        out = scheduler.schedule()
        logits = model.forward(StepInputs.build(out, "cpu"), pool)
        scheduler.update_from_output(out, logits[out.sample_rows].argmax(dim=-1).tolist())
    assert seqs[1].num_cached_tokens == 8, "the second prompt starts from the first one's two blocks"
    with torch.no_grad():
        for seq, prompt in zip(seqs, prompts):
            expected = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6, min_new_tokens=6,
                                   pad_token_id=256)[0, len(prompt):].tolist()
            assert seq.token_ids[len(prompt):] == expected
    assert np.unique(seqs[0].token_ids[len(prompts[0]):]).size > 1
