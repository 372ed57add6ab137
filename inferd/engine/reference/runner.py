"""The reference engine's runner: the NumPy decoder, its paged KV cache and the NumPy sampler."""
from __future__ import annotations

from pathlib import Path

from inferd.engine.reference.model import ForwardBatch, LlamaModel
from inferd.engine.reference.sampler import Sampler, grammar_masked, token_logprobs
from inferd.engine.runner import StepResult, prompt_logit_rows
from inferd.engine.scheduler import SchedulerOutput
from inferd.engine.speculative.draft_model import DraftModel, NumpyDraft
from inferd.engine.speculative.verify import with_verified_drafts
from inferd.types import TokenLogprob


class ReferenceRunner:
    """A ModelRunner (inferd.engine.runner) in float32 NumPy on the CPU."""

    def __init__(self, model: LlamaModel, num_kv_blocks: int, block_size: int,
                 drafter: DraftModel | None = None) -> None:
        self.model = model
        self.config = model.config
        self.kv = model.new_kv_cache(num_kv_blocks, block_size)
        self._sampler = Sampler()
        self.drafter = drafter          # guesses the drafts the scheduler made room for (a draft model)

    @classmethod
    def load(cls, artifact_dir: Path, num_kv_blocks: int, block_size: int,
             draft_dir: Path | None = None) -> "ReferenceRunner":
        model = LlamaModel.from_pretrained(artifact_dir)
        drafter = None if draft_dir is None else DraftModel(NumpyDraft.load(
            draft_dir, artifact_dir, model.config.vocab_size, num_kv_blocks, block_size))
        return cls(model, num_kv_blocks, block_size, drafter)

    def fatal(self, exc: Exception) -> bool:
        return False           # NumPy state survives any failed step

    def memory_bytes(self) -> int:
        drafter = self.drafter.memory_bytes() if self.drafter is not None else 0
        return self.model.weight_bytes() + sum(a.nbytes for a in (*self.kv.k, *self.kv.v)) + drafter

    def execute(self, out: SchedulerOutput) -> StepResult:
        for src, dst in out.block_copies:       # forked sequences' partial blocks, before they are read
            self.kv.copy_block(src, dst)
        draft_probs = self.drafter.guess(out) if out.draft_rows and self.drafter is not None else None
        batch = ForwardBatch(token_ids=out.token_ids, positions=out.positions, slot_mapping=out.slot_mapping,
                             query_lens=out.num_new_tokens, context_lens=out.context_lens,
                             block_tables=out.block_tables, loras=[seq.lora for seq in out.seqs])
        every = prompt_logit_rows(out)
        prompt_logits, draft_logits = [], {}
        if every or out.draft_rows:
            logits, full = self.model.forward_every(batch, self.kv, every + out.draft_rows)
            prompt_logits = [(out.seqs[i], out.seqs[i].num_computed_tokens, chunk) for i, chunk in zip(every, full)]
            draft_logits = dict(zip(out.draft_rows, full[len(every):]))
        else:
            logits = self.model.forward(batch, self.kv)
        rows = out.sample_rows
        if len(rows) != len(out.seqs):
            logits = logits[rows]
        picked = [out.seqs[r] for r in rows]
        if draft_logits:
            return self._verify(logits, rows, picked, draft_logits, prompt_logits, draft_probs)
        step = self._sample(logits, picked)
        step.prompt_logits = prompt_logits
        return step

    def _verify(self, logits, rows, picked, draft_logits, prompt_logits, draft_probs=None) -> StepResult:
        """A step with drafts: rows without one sampled as usual, each draft row verified (rows that
        speculate have no grammar, logprobs, penalties or bias: inferd.engine.speculative.drafting)."""
        plain = [j for j, row in enumerate(rows) if row not in draft_logits]
        tokens = [0] * len(rows)
        logprobs: list[TokenLogprob | None] = [None] * len(rows)
        if plain:
            step = self._sample(logits[plain], [picked[j] for j in plain])
            for j, token, logprob in zip(plain, step.tokens, step.logprobs):
                tokens[j], logprobs[j] = token, logprob
        kept = with_verified_drafts(tokens, rows, picked, draft_logits, draft_probs)
        return StepResult(tokens, logprobs, prompt_logits, kept)

    def _sample(self, logits, picked) -> StepResult:
        """Sample rows without drafts: grammar masks, penalties, logprobs as asked."""
        logits = grammar_masked(logits, picked)
        tokens = self._sampler.sample(logits, [s.sampling for s in picked], [s.rng for s in picked], picked)
        logprobs: list[TokenLogprob | None] = [None] * len(picked)
        wanted = [j for j, s in enumerate(picked) if s.sampling.logprobs is not None]
        if wanted:      # only the rows that asked pay for log_softmax (a grammar's mask included, as vLLM)
            found = token_logprobs(logits[wanted], [tokens[j] for j in wanted],
                                   [picked[j].sampling.logprobs for j in wanted])
            for j, lp in zip(wanted, found):
                logprobs[j] = lp
        return StepResult(tokens, logprobs)
