"""A real byte-level BPE tokenizer, trained offline on a corpus generated here.

Synthetic artifacts need a tokenizer that behaves like production ones (byte-level BPE,
multi-byte characters split across tokens, special tokens, a chat template) without
downloading anything. The corpus comes from a seeded PRNG, and `tokenizers` sorts its
alphabet and breaks merge ties by pair id, so the same (vocab_size, seed) trains the
same tokenizer.json byte for byte.
"""
from __future__ import annotations

import itertools
import json
import random
import threading
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, IM_START, IM_END, PAD_TOKEN)

# ChatML with a BOS in front, as the template in tokenizer_config.json. Unknown roles fail
# through raise_exception so a bad request gets a clear error instead of a silent prompt.
# ChatML, with Qwen2.5's (Hermes-style) tools: the tools' JSON inside <tools></tools> in the system turn, calls as
# <tool_call>{"name": ..., "arguments": ...}</tool_call> in the assistant's turn, tool results as
# <tool_response> in a user turn (the tool_call_format "hermes" parses the calls back). Qwen's instructions are
# cut to one line: the synthetic models follow none, and their contexts are short (tiny's is 512 tokens).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '# Tools\n\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nCalls: <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n'"
    " '</tool_call><|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "{% if message['role'] == 'system' and tools and loop.first %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant' }}"
    "{% if message['content'] %}{{ '\n' + message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] %}"
    "{% set call = call['function'] if call['function'] is defined else call %}"
    "{{ '\n<tool_call>\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' + (call['arguments'] | tojson)"
    " + '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_COMMON_WORDS = (
    "the of and to in is that it was for on are as with his they at be this from have or by one had "
    "not but what all were when we there can an your which their said if do will each about how up out "
    "them then she many some so these would other into has more her two like him see time could no make "
    "than first been its who now people my made over did down only way find use may water long little "
    "very after words called just where most know get through back much before go good new write our "
    "used me man too any day same right look think also around another came come work three word must "
    "because does part even place well such here take why things help put years different away again "
    "off went old number great tell men say small every found still between name should home big give "
    "air line set own under read last never us left end along while might next sound below saw something "
    "thought both few those always looked show large often together asked house world going want school "
    "important until form food keep children feet land side without boy once animals life enough took "
    "model token server request stream queue tenant engine batch cache block prompt answer question"
).split()
_ONSETS = ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "st", "th", "tr", "qu")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ou", "oo", "io")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "rt", "sh")
_PUNCT = (".", ".", ".", ",", "!", "?", ";", ":")
# A few CJK characters and emoji appear rarely, so the tokenizer learns some partial-character
# merges while most multi-byte characters still need several tokens (what the UTF-8 tests need).
_RARE = ("你好", "世界", "中文", "日本語", "é", "ñ", "ü", "€", "—", "→", "🙂", "🚀")


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(rng.choice((1, 1, 2, 2, 3))))


def generate_corpus(num_lines: int, seed: int, lexicon_size: int) -> list[str]:
    """Deterministic English-like text with numbers, code, chat markup and a little non-ASCII."""
    rng = random.Random(seed)
    lexicon = list(_COMMON_WORDS) + [_pseudo_word(rng) for _ in range(lexicon_size)]
    # Zipf-like weights (flattened) so the long tail is frequent enough to earn merges.
    cum_weights = list(itertools.accumulate(1.0 / (rank + 1) ** 0.7 for rank in range(len(lexicon))))
    lines = []
    for _ in range(num_lines):
        kind = rng.random()
        if kind < 0.75:
            words = rng.choices(lexicon, cum_weights=cum_weights, k=rng.randint(4, 18))
            words[0] = words[0].capitalize()
            if rng.random() < 0.05:
                words.insert(rng.randrange(len(words)), rng.choice(_RARE))
            if rng.random() < 0.15:
                words.insert(rng.randrange(len(words)), str(rng.randint(0, 100000)))
            lines.append(" ".join(words) + rng.choice(_PUNCT))
        elif kind < 0.88:
            name, arg = rng.choice(lexicon), rng.choice(lexicon)
            lines.append(f"def {name}_{arg}({arg}, n={rng.randint(0, 99)}):\n    return {arg}[n] + {rng.random():.3f}")
        else:
            role = rng.choice(("system", "user", "assistant"))
            text = " ".join(rng.choices(lexicon, cum_weights=cum_weights, k=rng.randint(3, 10)))
            lines.append(f"{IM_START}{role}\n{text}{IM_END}")
    return lines


# Trained tokenizers by (vocab_size, num_lines, seed), serialised: the shipped `small` and `embed` train
# the same one, and a first start builds both at once; training is a second of CPU each on a laptop.
_trained: dict[tuple[int, int, int], str] = {}
_training_lock = threading.Lock()


def train_byte_level_bpe(vocab_size: int, *, num_lines: int, seed: int = 0) -> Tokenizer:
    """Train a Llama-3-style byte-level BPE whose post-processor prepends BOS (once per process and
    arguments: later calls get a fresh copy of the first result, which callers may modify)."""
    key = (vocab_size, num_lines, seed)
    with _training_lock:        # a second build with the same arguments waits for the first's result
        if key not in _trained:
            _trained[key] = _train(vocab_size, num_lines=num_lines, seed=seed).to_str()
        return Tokenizer.from_str(_trained[key])


def _train(vocab_size: int, *, num_lines: int, seed: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(generate_corpus(num_lines, seed, lexicon_size=vocab_size), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    return tokenizer


def _stable_json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_tokenizer_files(directory: Path, tokenizer: Tokenizer, *, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json in the layout transformers' AutoTokenizer reads."""
    # to_str() serializes the vocab in id order and merges in training order: byte-stable.
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    added_tokens_decoder = {
        str(tokenizer.token_to_id(tok)): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
        for tok in SPECIAL_TOKENS
    }
    config = {
        "added_tokens_decoder": added_tokens_decoder,
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (directory / "tokenizer_config.json").write_text(_stable_json(config), encoding="utf-8")
