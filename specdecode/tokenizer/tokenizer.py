"""`Tokenizer`: a `tokenizers.Tokenizer` built from GGUF metadata or from a Hugging Face directory.

A GGUF means what llama.cpp (the format's reference) does with it (gguf_vocab.py builds the backend),
and end-of-generation ids include llama.cpp's by-name EOG tokens. A Hugging Face directory means what
`tokenizer.json` says (tokenizers is the reference there). All BPE work is done by `tokenizers`.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import gguf
from tokenizers import Tokenizer as Backend

from specdecode.errors import InvalidRequestError, ModelFileError, SpecDecodeError
from specdecode.tokenizer import chat
from specdecode.tokenizer.gguf_vocab import gguf_backend, gguf_metadata, open_gguf

# Tokens llama.cpp stops on by their text (llama_vocab::impl::load), besides the eos/eot/eom ids.
EOG_NAMES = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                       "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>", "<|return|>"})


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: unreadable JSON ({e})") from None


class Tokenizer:
    """Text <-> token ids. Invariant: `decode(encode(t, add_special_tokens=False)) == t` for byte-level BPE."""

    def __init__(self, backend: Backend, *, bos_id: int | None, eos_ids, pad_id: int | None = None,
                 chat_template: str | None = None, vocab_size: int | None = None):
        self.backend = backend
        self._bos_id, self._pad_id, self._chat_template = bos_id, pad_id, chat_template
        eos_ids = list(eos_ids)  # the first non-None one is the model's own eos_token (for templates)
        self._eos_id = next((i for i in eos_ids if i is not None), None)
        self._vocab_size = vocab_size or backend.get_vocab_size(with_added_tokens=True)
        specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        eog = {backend.token_to_id(name) for name in EOG_NAMES & specials}
        self._eos_ids = frozenset(i for i in {*eos_ids, *eog} if i is not None)

    @classmethod
    def from_gguf(cls, source) -> "Tokenizer":
        """From a GGUF path, a GGUFReader, or any parsed file with a `.metadata` dict (the weight
        loader's GGUFFile), so an open file is not parsed twice."""
        try:
            if hasattr(source, "metadata"):  # numeric arrays may be numpy there
                meta = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in source.metadata.items()
                        if k.startswith("tokenizer.")}
            else:
                meta = gguf_metadata(source if isinstance(source, gguf.GGUFReader) else open_gguf(source), "tokenizer.")
            g = {k[len("tokenizer.ggml."):]: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}
            backend = gguf_backend(g)
        except SpecDecodeError:
            raise
        except Exception as e:  # bad UTF-8, or tokenizers refusing the table (a bare Exception from Rust)
            raise ModelFileError(f"GGUF tokenizer cannot be built: {str(e).splitlines()[0]}") from None
        eos = [g.get(k) for k in ("eos_token_id", "eot_token_id", "eom_token_id")]  # eos_token first
        return cls(backend, bos_id=g.get("bos_token_id"), eos_ids=eos, pad_id=g.get("padding_token_id"),
                   chat_template=meta.get("tokenizer.chat_template"), vocab_size=len(g["tokens"]))

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike) -> "Tokenizer":
        d = Path(path)
        if not (d / "tokenizer.json").is_file():
            raise ModelFileError(f"{d}: no tokenizer.json (only 'fast' Hugging Face tokenizers are supported)")
        try:
            backend = Backend.from_file(str(d / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception for malformed files
            raise ModelFileError(f"{d / 'tokenizer.json'}: cannot load ({str(e).splitlines()[0]})") from None
        cfg = _read_json(d / "tokenizer_config.json")
        # The template lives in chat_template.jinja (newer), chat_template.json, or tokenizer_config.json.
        template = cfg.get("chat_template")
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text(encoding="utf-8")
        elif (d / "chat_template.json").is_file():
            template = _read_json(d / "chat_template.json").get("chat_template", template)
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)

        def ids(key):  # tokenizer_config.json spells a special token as a string or as {"content": ...}
            name = cfg.get(key).get("content") if isinstance(cfg.get(key), dict) else cfg.get(key)
            return backend.token_to_id(name) if name else None

        gen = _read_json(d / "generation_config.json").get("eos_token_id")
        eos = [ids("eos_token"), *(gen if isinstance(gen, list) else [gen])]
        return cls(backend, bos_id=ids("bos_token"), eos_ids=eos, pad_id=ids("pad_token"), chat_template=template)

    vocab_size = property(lambda self: self._vocab_size, doc="Number of ids (GGUF: the token table's length).")
    bos_id = property(lambda self: self._bos_id, doc="BOS id, or None when the model has none.")
    eos_ids = property(lambda self: self._eos_ids,
                       doc="Every id that ends generation: eos, eot/eom, generation_config's, llama.cpp's EOG names.")
    pad_id = property(lambda self: self._pad_id)
    chat_template = property(lambda self: self._chat_template, doc="Jinja chat template, or None.")

    # --- text <-> ids -----------------------------------------------------------------------------
    @functools.cached_property
    def max_piece_chars(self) -> int:
        """The longest vocabulary entry as stored: no token covers more characters of text than this
        (a byte-level piece has a character per byte), so a text of c characters has at least about
        c / max_piece_chars tokens (normalization aside): a bound checked before tokenizing."""
        return max(map(len, self.backend.get_vocab(with_added_tokens=True)), default=1)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids for `text`; special tokens written in the text (e.g. `<|im_start|>`) become their ids.
        `add_special_tokens` adds what the model asks for (BOS for most sentencepiece models); use False
        for text rendered by a chat template, which writes its own BOS."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def id_to_piece(self, token_id: int) -> str | None:
        """The vocabulary entry as stored (byte-level pieces use GPT-2's alphabet, e.g. 'Ġthe')."""
        return self.backend.id_to_token(int(token_id))

    def piece_to_id(self, piece: str) -> int | None:
        return self.backend.token_to_id(piece)

    def _piece_or_empty(self, token_id: int | None) -> str:
        return (self.id_to_piece(token_id) or "") if token_id is not None else ""

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kw) -> str:
        """Render `messages` with the model's template. A model without one gets ChatML if its
        vocabulary has `<|im_start|>`/`<|im_end|>`; otherwise this is an InvalidRequestError."""
        template = self._chat_template
        if template is None and not (self.piece_to_id("<|im_start|>") is not None
                                     and self.piece_to_id("<|im_end|>") is not None):
            raise InvalidRequestError("this model has no chat template; send a plain completion prompt instead")
        kw.setdefault("bos_token", self._piece_or_empty(self._bos_id))
        kw.setdefault("eos_token", self._piece_or_empty(self._eos_id))
        return chat.apply_chat_template(template, messages, add_generation_prompt=add_generation_prompt, **kw)
