"""Tokenizers (from GGUF metadata or a Hugging Face directory), chat templates, streaming detokenization."""
from specdecode.tokenizer.chat import CHATML_TEMPLATE, apply_chat_template
from specdecode.tokenizer.detok import StreamingDetokenizer
from specdecode.tokenizer.gguf_vocab import gguf_metadata, open_gguf
from specdecode.tokenizer.tokenizer import Tokenizer

__all__ = ["Tokenizer", "StreamingDetokenizer", "apply_chat_template", "CHATML_TEMPLATE", "open_gguf", "gguf_metadata"]
