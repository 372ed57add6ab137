"""A draft model for the reference engine: a smaller artifact of the same tokenizer guesses the next tokens.

The scheduler has already placed each drafting sequence's k guesses (placeholders) in the step and given
them KV blocks; before the target's forward pass, `DraftModel.fill` runs the draft model k times over
those sequences and writes its guesses into the step. Its KV cache mirrors the target's block geometry and
is indexed by the same block tables, so it needs no block manager of its own: a sequence's draft K/V sits in
the same slots as its target K/V. What it has written is `Sequence.draft_kv_len` tokens; the prefix that
is still right after a verification is min(that, tokens - 1) (rejected guesses' slots are rewritten next
time), and a preemption resets it with the blocks. A sequence's first draft also computes its prompt
through the draft model (its prefill).

Guesses for a greedy request are the draft's argmax; for a sampled one, drawn from the draft's
distribution under the request's temperature, min-p, top-k and top-p, which verification then needs
(inferd.engine.speculative.verify: q in min(1, p/q)).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from inferd.engine.reference.model import ForwardBatch, LlamaModel
from inferd.engine.sequence import Sequence


class DraftModelMismatch(ValueError):
    """The draft artifact cannot draft for the target: another vocabulary or tokenizer."""


class DraftForward(Protocol):
    """A draft model over its own KV storage, laid out as the target's blocks (NumPy here; torch: torch.draft)."""

    def logits(self, seqs: list[Sequence], queries: list[list[int]], starts: list[int]) -> np.ndarray:
        """The model over `queries[i]` at positions starts[i].. of seqs[i] (K/V written at the slots seqs[i]'s
        block table gives them): float logits at each query's last token, [len(seqs), vocab]."""
        ...

    def memory_bytes(self) -> int:
        ...


def check_draft_artifact(draft_dir: Path, target_dir: Path) -> None:
    """A draft must share the target's tokenizer token for token (its tokenizer.json byte for byte)."""
    if (Path(draft_dir) / "tokenizer.json").read_bytes() != (Path(target_dir) / "tokenizer.json").read_bytes():
        raise DraftModelMismatch(f"draft model {draft_dir}: its tokenizer is not the target's ({target_dir}); a "
                                 f"draft must share it token for token")


def check_draft_vocabulary(draft_dir: Path, draft_vocab: int, vocab_size: int) -> None:
    if draft_vocab != vocab_size:
        raise DraftModelMismatch(f"draft model {draft_dir}: vocabulary of {draft_vocab} tokens, the target's is "
                                 f"{vocab_size}")


def positions_and_slots(seqs: list[Sequence], queries: list[list[int]], starts: list[int],
                        block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query token's position and KV slot (through its sequence's block table), packed."""
    positions = np.concatenate([np.arange(s, s + len(q), dtype=np.int64) for q, s in zip(queries, starts)])
    slots = np.concatenate([np.asarray(seq.block_table, dtype=np.int64)[pos // block_size] * block_size
                            + pos % block_size
                            for seq, pos in zip(seqs, np.split(positions, np.cumsum([len(q) for q in queries])[:-1]))])
    return positions, slots


class NumpyDraft:
    """The reference engine's draft: a LlamaModel and its KV cache of the target's block geometry."""

    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int) -> None:
        self.model = model
        self.kv = model.new_kv_cache(num_blocks, block_size)

    @classmethod
    def load(cls, draft_dir: Path, target_dir: Path, vocab_size: int, num_blocks: int, block_size: int) -> "NumpyDraft":
        check_draft_artifact(draft_dir, target_dir)
        model = LlamaModel.from_pretrained(draft_dir)
        check_draft_vocabulary(draft_dir, model.config.vocab_size, vocab_size)
        return cls(model, num_blocks, block_size)

    def memory_bytes(self) -> int:
        return self.model.weight_bytes() + sum(a.nbytes for a in (*self.kv.k, *self.kv.v))

    def logits(self, seqs: list[Sequence], queries: list[list[int]], starts: list[int]) -> np.ndarray:
        positions, slots = positions_and_slots(seqs, queries, starts, self.kv.block_size)
        batch = ForwardBatch(token_ids=np.asarray([t for q in queries for t in q], dtype=np.int64),
                             positions=positions, slot_mapping=slots, query_lens=[len(q) for q in queries],
                             context_lens=[s + len(q) for s, q in zip(starts, queries)],
                             block_tables=[seq.block_table for seq in seqs])
        return self.model.forward(batch, self.kv)


class DraftModel:
    """Guesses the drafts the scheduler made room for, with a draft model (`forward`), step thread only."""

    def __init__(self, forward: DraftForward) -> None:
        self.forward = forward

    def memory_bytes(self) -> int:
        return self.forward.memory_bytes()

    def guess(self, out) -> dict[int, np.ndarray | None]:
        """Guess the drafts of a scheduled step (a SchedulerOutput whose draft rows hold placeholders), written
        over them: batch row -> the guesses' distributions (None: greedy)."""
        ends = np.cumsum(out.num_new_tokens)
        seqs = [out.seqs[row] for row in out.draft_rows]
        offsets = [int(ends[row]) - len(seq.draft) for row, seq in zip(out.draft_rows, seqs)]
        return dict(zip(out.draft_rows, self.fill(seqs, offsets, out.token_ids)))

    def fill(self, seqs: list[Sequence], offsets: list[int], token_ids: np.ndarray) -> list[np.ndarray | None]:
        """Guess each sequence's draft (its length as scheduled) and write it into `seq.draft` and into the
        step's packed `token_ids` at `offsets[i]` onwards. Returns each sequence's draft distributions
        ([len(draft), vocab] float64; None for a greedy request)."""
        probs: list[list[np.ndarray]] = [[] for _ in seqs]
        # the first pass: catch up on what the draft has not seen, ending with the last token
        starts = [min(seq.draft_kv_len, seq.num_tokens - 1) for seq in seqs]
        first = self.forward.logits(seqs, [seq.token_ids[s:] for seq, s in zip(seqs, starts)], starts)
        last = dict(enumerate(first))
        for step in range(max(len(seq.draft) for seq in seqs)):
            live = [i for i, seq in enumerate(seqs) if step < len(seq.draft)]
            if step > 0:        # each further pass feeds back the previous guess
                rows = [seqs[i] for i in live]
                last = dict(zip(live, self.forward.logits(rows, [[row.draft[step - 1]] for row in rows],
                                                          [row.num_tokens + step - 1 for row in rows])))
            for i in live:
                seq = seqs[i]
                token, q = _guess(last[i], seq)
                seq.draft[step] = token
                token_ids[offsets[i] + step] = token
                if q is not None:
                    probs[i].append(q)
        for seq in seqs:
            seq.draft_kv_len = seq.num_tokens + len(seq.draft) - 1
        return [np.stack(p) if p else None for p in probs]


def _guess(logits: np.ndarray, seq: Sequence) -> tuple[int, np.ndarray | None]:
    """The draft's token at one position, and its distribution when the request samples."""
    params = seq.sampling
    if params.greedy:
        return int(np.argmax(logits)), None
    from inferd.engine.reference.sampler import candidate_probs

    ids, probs = candidate_probs(logits, params)
    index = int(np.searchsorted(np.cumsum(probs), seq.rng.random(), side="right"))
    q = np.zeros(logits.shape[0])
    q[ids] = probs
    return int(ids[min(index, ids.shape[0] - 1)]), q
