"""A `tokenizers` backend from a GGUF file's vocabulary, as llama.cpp (the format's reference) reads it:
token types decide which tokens are matched whole, `tokenizer.ggml.pre` picks llama.cpp's split regexes,
`add_bos_token` adds BOS. Also a GGUF's metadata read with `gguf`'s own reader (``open_gguf``,
``gguf_metadata``), for a file the weight loader has not parsed."""
from __future__ import annotations

import os
import sys

import gguf
import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from specdecode.errors import ModelFileError, UnsupportedModelError

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# `tokenizer.ggml.pre` -> the regexes llama.cpp (llama-vocab.cpp) applies in turn, each one splitting
# every piece and keeping matches and gaps alike ("isolated"). "default" (also a missing key) is
# llama.cpp's fallback for old conversions; transformers would use plain GPT-2 there instead.
_PRE_SPLITS = {
    **dict.fromkeys(("gpt2", "mpt", "olmo", "jais"), (_GPT2,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"),
                    (r"\p{N}", _GPT2)),
    **dict.fromkeys(("qwen2", "stablelm2", "deepseek-r1-qwen", "hunyuan"), (_QWEN2,)),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "dbrx", "smaug-bpe", "pixtral"), (_LLAMA3,)),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
}
# llama.cpp treats merges as absolute for these: a word that is itself a token is not re-merged.
_IGNORE_MERGES = {"llama-bpe", "llama3", "llama-v3", "falcon3", "dbrx", "smaug-bpe", "pixtral"}
_T = gguf.TokenType
# GPT-2's byte alphabet: printable bytes stand for themselves, the other 68 map to chr(256 + n) in order.
_KEEP = [*range(33, 127), *range(161, 173), *range(174, 256)]
_BYTE_CHARS = {**{b: chr(b) for b in _KEEP},
               **{b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in _KEEP)}}
_STRING, _ARRAY = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY


class _FastReader(gguf.GGUFReader):
    """GGUFReader without np.memmap's per-slice overhead, which dominates a 151k-token vocabulary:
    Qwen2.5's metadata takes 6.7 s with the stock reader and 1.6 s with this. Tensor data stays mapped."""

    def _get(self, offset, dtype, count=1, override_order=None):
        buf = self.__dict__.get("_plain")
        if buf is None:
            buf = self._plain = self.data.view(np.ndarray)
        dt = np.dtype(dtype)
        arr = buf[offset:offset + dt.itemsize * int(count)].view(dt)
        order = override_order or self.byte_order
        if order == "S" or (order == "<" and sys.byteorder != "little"):
            arr = arr.view(dt.newbyteorder(order))
        return arr


def open_gguf(path: str | os.PathLike) -> gguf.GGUFReader:
    """A GGUFReader for `path` (fast variant when this gguf version allows); errors are one-line."""
    if not os.path.isfile(path):
        raise ModelFileError(f"{path}: no such file")
    try:
        try:
            return _FastReader(path)
        except (TypeError, AttributeError):  # gguf internals changed: the stock reader is always right
            return gguf.GGUFReader(path)
    except (ValueError, KeyError, OSError, IndexError) as e:
        raise ModelFileError(f"{path}: not a readable GGUF file ({e})") from None


def gguf_metadata(reader: gguf.GGUFReader, prefix: str = "") -> dict:
    """Metadata values (strings decoded, arrays as lists) for keys starting with `prefix`; no tensor data."""
    out = {}
    for key, f in reader.fields.items():
        if not key.startswith(prefix) or not f.types:
            continue
        if f.types[0] == _ARRAY:
            if len(f.types) > 1 and f.types[1] == _STRING:
                out[key] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                out[key] = [v for i in f.data for v in f.parts[i].tolist()]
        elif f.types[0] == _STRING:
            out[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            out[key] = f.parts[f.data[0]].tolist()[0]
    return out


def _byte_level_backend(tokens: list[str], merges: list[str] | None, pre: str) -> Backend:
    if pre not in _PRE_SPLITS:
        known = ", ".join(sorted(_PRE_SPLITS))
        raise UnsupportedModelError(f"GGUF pre-tokenizer {pre!r} is not supported (known: {known})")
    if merges is None:
        raise ModelFileError("GGUF byte-level BPE vocabulary has no tokenizer.ggml.merges")
    # A byte-level BPE can only produce tokens spelled in the 256-char byte alphabet; a (rare) NORMAL
    # token stored as real text is respelled, as transformers does. Added tokens keep their text.
    alphabet = set(_BYTE_CHARS.values())
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t if set(t) <= alphabet else "".join(_BYTE_CHARS[b] for b in t.encode()), i)
    model = models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], ignore_merges=pre in _IGNORE_MERGES)
    backend = Backend(model)
    # Lone digits are split as the models' own tokenizer.json does it (Digits), which is llama.cpp's
    # \p{N} split but for 13 code points Rust counts as numeric beyond \p{N}.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True) if r == r"\p{N}" else
         pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE_SPLITS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def _spm_backend(tokens, scores, merges, unk: str | None, add_space_prefix: bool) -> Backend:
    """SentencePiece BPE as llama.cpp runs it: merge by the merged piece's score, bytes as <0xXX>."""
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        if scores is None:
            raise ModelFileError("GGUF sentencepiece vocabulary has neither merges nor scores")
        # Every split of a piece into two known pieces is a merge ranked by the piece's score; ties go
        # as transformers' generate_merges orders them, so both build the same tokenizer.
        found = []
        for piece, score in zip(tokens, scores):
            local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                     if piece[:k] in vocab and piece[k:] in vocab]
            found += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
        pairs = [(a, b) for a, b, _ in found]
    backend = Backend(models.BPE(vocab, pairs, unk_token=unk, fuse_unk=True, byte_fallback=True))
    # llama.cpp (like sentencepiece itself) puts a space before every stretch of text that starts the
    # input or follows a special token, even one that already starts with a space. A normalizer runs
    # on each stretch between added tokens, so Prepend does exactly that; Metaspace would skip the
    # prefix when the text starts with a space.
    space = [normalizers.Prepend("\u2581")] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence(space + [normalizers.Replace(" ", "\u2581")])
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    return backend


def gguf_backend(meta: dict) -> Backend:
    """The backend the ``tokenizer.ggml.*`` entries of a GGUF describe (keys without that prefix)."""
    tokens, kind = meta.get("tokens"), meta.get("model")
    if not tokens:
        raise ModelFileError("GGUF file has no tokenizer (tokenizer.ggml.tokens is missing)")
    if kind == "gpt2":
        backend = _byte_level_backend(tokens, meta.get("merges"), meta.get("pre") or "default")
    elif kind == "llama":
        unk_id = meta.get("unknown_token_id")
        unk = tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else None
        backend = _spm_backend(tokens, meta.get("scores"), meta.get("merges"), unk, meta.get("add_space_prefix", True))
    else:
        raise UnsupportedModelError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    # Control (and unknown) tokens are special, user-defined ones plain added tokens: both are matched
    # whole in the input. Each is added only where the vocabulary has it at its own id, so adding
    # never creates an id past the vocabulary.
    want = {int(_T.CONTROL): True, int(_T.UNKNOWN): True, int(_T.USER_DEFINED): False}
    types = meta.get("token_type") or [int(_T.NORMAL)] * len(tokens)
    added = [AddedToken(t, special=want[ty], normalized=False)
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty in want and backend.token_to_id(t) == i]
    backend.add_special_tokens([a for a in added if a.special])
    backend.add_tokens([a for a in added if not a.special])
    if backend.get_vocab_size(with_added_tokens=True) > len(tokens):  # (duplicate tokens make it smaller)
        raise ModelFileError("GGUF token table is inconsistent (added tokens fell outside the vocabulary)")
    # llama.cpp adds BOS to sentencepiece vocabularies unless the file says otherwise.
    bos, eos = meta.get("bos_token_id"), meta.get("eos_token_id")
    first = [(tokens[bos], bos)] if meta.get("add_bos_token", kind == "llama") and bos is not None else []
    last = [(tokens[eos], eos)] if meta.get("add_eos_token") and eos is not None else []
    if first or last:  # (list form: a token's text may hold spaces)
        around = lambda seq: [*(t for t, _ in first), seq, *(t for t, _ in last)]  # noqa: E731
        backend.post_processor = processors.TemplateProcessing(
            single=around("$A"), pair=around("$A") + around("$B:1"), special_tokens=first + last)
    return backend
