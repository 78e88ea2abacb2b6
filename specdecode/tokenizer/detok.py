"""Incremental detokenization for streaming: text appears as soon as it is whole, never as broken UTF-8.

Decoding one token at a time is wrong in two ways: a character split across tokens (byte-level BPE,
or sentencepiece byte-fallback `<0xE4>` tokens) decodes to U+FFFD until its last byte arrives, and
decoders that treat the first token specially (sentencepiece strips the leading space of the text)
would strip a space from every token. So, as in Hugging Face's TextStreamer and vLLM, we decode a
short window that starts a few tokens back and emit only what lies past the already-emitted part:

    ids[prefix:read]  decodes to text already emitted (the "context" window),
    ids[prefix:]      decodes to that text plus the new text.

Invariant: the concatenation of every `add()` and the final `flush()` equals
`tokenizer.decode(all_ids)` (with the same skip_special_tokens). The window only moves forward at a
point where the decoded text does not end in U+FFFD, i.e. at a character boundary, so cutting the
ids there cuts the text there too.
"""
from __future__ import annotations

_REPLACEMENT = "\ufffd"


class StreamingDetokenizer:
    """Feed generated ids one at a time with `add`; call `flush` once at the end of the stream."""

    def __init__(self, tokenizer, skip_special_tokens: bool = False):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids[:read] are fully emitted; ids[read:] are held back

    def _decode(self, ids) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def _new_text(self) -> tuple[str, str]:
        done = self._decode(self.ids[self._prefix:self._read])
        return done, self._decode(self.ids[self._prefix:])

    def add(self, token_id: int) -> str:
        """Append one id; return the text it (with any held-back ids) completes, possibly ''."""
        self.ids.append(int(token_id))
        done, full = self._new_text()
        # A trailing U+FFFD is (almost always) a character whose remaining bytes are still to come.
        # A genuine U+FFFD in the output is only delayed until the next token or flush.
        if full.endswith(_REPLACEMENT) or len(full) <= len(done) or not full.startswith(done):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return full[len(done):]

    def flush(self) -> str:
        """Whatever is held back, emitted as decode() would render it (incomplete bytes as U+FFFD)."""
        done, full = self._new_text()
        self._prefix = self._read = len(self.ids)
        return full[len(done):] if full.startswith(done) else full

    def reset(self) -> None:
        self.ids.clear()
        self._prefix = self._read = 0
