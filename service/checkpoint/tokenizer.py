"""A small deterministic byte-level BPE tokenizer for the tiny MOSS checkpoint.

* Byte-level: the 256 byte symbols are the base vocabulary (ids 0-255, in byte order),
  so any text round-trips.
* Merges are learned here, deterministically (most frequent pair first, ties broken by
  the pair itself), from a small built-in corpus: the prompt template, the contract's
  Chinese default instruction, the hotword prefix, the clip's English words, and
  MOSS-format timestamps/speaker tags.
* Digits are pre-tokenized one by one, so ``0``-``9`` are always single tokens and
  never merged (the processor's time markers rely on it).
* Special tokens come last: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``,
  ``<|audio_start|>``, ``<|audio_pad|>``, ``<|audio_end|>``.
* The number of merges is chosen so that the whole vocabulary is a multiple of 64,
  so the model's vocabulary has no padding rows (no ids the tokenizer cannot decode).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|audio_start|>",
    "<|audio_pad|>",
    "<|audio_end|>",
)
VOCAB_MULTIPLE = 64
TARGET_VOCAB_SIZE = 512  # 256 bytes + 250 merges + 6 specials

# Letters (with an optional leading space), single digits, punctuation runs, whitespace.
PRETOKENIZE_PATTERN = r" ?\p{L}+| ?\p{M}+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+|\s+(?!\S)|\s+"

# The chat template renders exactly the contract's prompt.  Written with explicit
# '\n' expressions only, so Jinja's trim_blocks/lstrip_blocks cannot change it.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(has_system=false) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.has_system = true -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if not ns.has_system -%}"
    "{{- '<|im_start|>system' + '\\n' + 'You are a helpful assistant.' + '<|im_end|>' + '\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{%- if part['type'] == 'audio' or part['type'] == 'input_audio' -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- else -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant' + '\\n' -}}"
    "{%- endif -%}"
)

_CORPUS_TEXTS: tuple[str, ...] = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>\n",
    "请将音频转写为文本，每一段需以起始时间戳和说话人编号（[S01]、[S02]、[S03]…）开头，"
    "正文为对应的语音内容，并在段末标注结束时间戳，以清晰标明该段语音范围。<|im_end|>\n"
    "<|im_start|>assistant\n",
    "热词提示：",
    "Good morning everyone. The pipeline is ready. Let us check the numbers. Thank you, see you soon.",
    "Welcome everyone. Good evening. The meeting is about the model and the service. "
    "We transcribe speech into text with speakers and timestamps. Is the test ready? "
    "Yes, it is. Please check the audio, the results and the time. Thanks.",
)


def _corpus() -> list[str]:
    texts = list(_CORPUS_TEXTS)
    # Weight the clip transcript and the instruction more than the filler text.
    texts += [_CORPUS_TEXTS[3]] * 4 + [_CORPUS_TEXTS[1]] * 2
    stamps = []
    for t in range(0, 3000, 7):
        stamps.append(f"[{t / 100:.2f}][S0{1 + t % 3}]")
    texts.append("".join(stamps))
    return texts


def bytes_to_unicode() -> dict[int, str]:
    """Byte-level alphabet: printable bytes keep their character, the others are
    shifted to code points 256+ so every byte is a visible, non-space character."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    mapping: dict[int, str] = {}
    shift = 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _learn_merges(words: Counter[tuple[str, ...]], known: set[str], num_new: int) -> list[tuple[str, str]]:
    """Greedy BPE: merge the most frequent adjacent pair (ties: smallest pair) until
    ``num_new`` new symbols exist or nothing is left to merge."""
    vocab = dict(words)
    merges: list[tuple[str, str]] = []
    known = set(known)
    new = 0
    while new < num_new:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, freq in vocab.items():
            for a, b in zip(word, word[1:], strict=False):
                pairs[(a, b)] += freq
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        if joined not in known:
            known.add(joined)
            new += 1
        new_vocab: dict[tuple[str, ...], int] = {}
        for word, freq in vocab.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            key = tuple(out)
            new_vocab[key] = new_vocab.get(key, 0) + freq
        vocab = new_vocab
    return merges


def build_tokenizer(target_vocab_size: int = TARGET_VOCAB_SIZE) -> Tokenizer:
    if target_vocab_size % VOCAB_MULTIPLE:
        raise ValueError("target_vocab_size must be a multiple of 64")
    pre = _pre_tokenizer()
    special = set(SPECIAL_TOKENS)
    words: Counter[tuple[str, ...]] = Counter()
    for text in _corpus():
        # special tokens are never part of BPE words
        for piece in _split_specials(text, special):
            if piece in special or not piece:
                continue
            for word, _ in pre.pre_tokenize_str(piece):
                words[tuple(word)] += 1

    alphabet = bytes_to_unicode()
    vocab: dict[str, int] = {alphabet[b]: b for b in range(256)}
    num_new = target_vocab_size - 256 - len(SPECIAL_TOKENS)
    merges = _learn_merges(words, set(vocab), num_new)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))

    model = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def _split_specials(text: str, special: set[str]) -> list[str]:
    pieces = [text]
    for token in sorted(special, key=len, reverse=True):
        nxt: list[str] = []
        for p in pieces:
            if p in special:
                nxt.append(p)
                continue
            parts = p.split(token)
            for i, part in enumerate(parts):
                if i:
                    nxt.append(token)
                nxt.append(part)
        pieces = nxt
    return pieces


def padded_vocab_size(tokenizer: Tokenizer) -> int:
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    return -(-n // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def save_tokenizer(tokenizer: Tokenizer, out_dir: Path, model_max_length: int) -> dict[str, int]:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and
    chat_template.jinja; return the special-token ids."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    ids: dict[str, int] = {}
    for token in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"special token {token} is missing from the tokenizer")
        ids[token] = token_id
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [
            "<|im_start|>",
            "<|im_end|>",
            "<|audio_start|>",
            "<|audio_pad|>",
            "<|audio_end|>",
        ],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(model_max_length),
        "padding_side": "left",
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    special_map = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": config["additional_special_tokens"],
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return ids
