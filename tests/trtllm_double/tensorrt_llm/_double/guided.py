"""The executor's guided decoding (not a real module): what cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp
does with xgrammar, through xgrammar's Python API (docs/trtllm-api.md §3b).

- Built only when the LLM has guided_decoding_backend="xgrammar": a GrammarCompiler over the tokenizer info
  llmapi/tokenizer.py `_xgrammar_tokenizer_info` gives (the vocabulary sorted by id, the tokenizer's JSON,
  stop token ids = [eos_token_id]), sized to the engine's padded vocabulary.
- A request's grammar is compiled when it is first scheduled, by guide type: JSON -> the builtin JSON
  grammar, JSON_SCHEMA -> compile_json_schema(guide) with xgrammar's defaults, REGEX and EBNF_GRAMMAR ->
  Grammar.from_regex / from_ebnf. It happens inside the executor's step: a grammar xgrammar refuses
  raises there (the double lets that kill the executor; the real outcome is not in the contract, which is
  why inferd never sends one).
- Each step the matcher's bitmask masks the logits; the sampled token is accepted at the next step.
"""
from __future__ import annotations

import json

import numpy as np


class GuidedDecoder:
    def __init__(self, tokenizer, vocab_size_padded: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        vocab = tokenizer.get_vocab()
        encoded = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(tokenizer.backend_tokenizer.to_str())
        info = xgr.TokenizerInfo(encoded, meta["vocab_type"], vocab_size=vocab_size_padded,
                                 stop_token_ids=[tokenizer.eos_token_id], add_prefix_space=meta["add_prefix_space"])
        self._compiler = xgr.GrammarCompiler(info)
        self.vocab_size = vocab_size_padded

    def matcher(self, guided) -> object:
        """A matcher for the request's GuidedDecodingParams (as SamplingParams._get_guided_decoding_params
        turns them into the C++ guide type)."""
        xgr, compiler = self._xgr, self._compiler
        if guided.json_object:
            compiled = compiler.compile_builtin_json_grammar()
        elif guided.json is not None:
            schema = guided.json if isinstance(guided.json, str) else json.dumps(guided.json)
            compiled = compiler.compile_json_schema(schema)
        elif guided.regex is not None:
            compiled = compiler.compile_grammar(xgr.Grammar.from_regex(guided.regex))
        elif guided.grammar is not None:
            compiled = compiler.compile_grammar(xgr.Grammar.from_ebnf(guided.grammar))
        else:
            return None
        return xgr.GrammarMatcher(compiled)

    def allowed(self, matcher) -> np.ndarray:
        bitmask = self._xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        return np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little", count=self.vocab_size).view(bool)
