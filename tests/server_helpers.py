"""What the server tests share: tiny engines with a chat template, clients, and waiting helpers."""
from __future__ import annotations

import time
from contextlib import contextmanager

import openai

from tiny_models import CharTokenizer, tiny_llm

KEY, MODEL = "test-key", "tiny"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"Content-Type": "application/json"}


class ChatCharTokenizer(CharTokenizer):
    """CharTokenizer with a trivial chat template; characters outside its table map to valid ids."""

    def encode(self, text, add_special_tokens=True):
        return [min(max(ord(c) - 0x21, 0), self.vocab_size - 1) for c in text]

    def apply_chat_template(self, messages, add_generation_prompt=True, **kw):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<a>" if add_generation_prompt else "")


def tiny_engine(spec_type="draft", max_num_seqs=3, **kw):
    # draft = the target plus noise, always 4 tokens: drafts are accepted part of the time
    if spec_type == "draft":
        kw = dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0, draft_fixed=True, draft_max=4, **kw)
    llm = tiny_llm(spec_type, max_num_seqs=max_num_seqs, **kw)
    llm.engine.tokenizer = llm.tokenizer = ChatCharTokenizer(llm.tokenizer.vocab_size)
    return llm.engine


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def chat(srv, content, max_tokens=12, **kw):
    kw.setdefault("temperature", 0)
    return client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                               max_tokens=max_tokens, **kw)


def hi(**kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kw}


def wait_idle(engine, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.running or engine.waiting or engine.kv.free_slots != engine.kv.num_slots:
        assert time.monotonic() < deadline, "requests still hold KV slots"
        time.sleep(0.01)


@contextmanager
def slow_steps(engine, seconds=0.01):
    """Long requests stay in flight long enough to be cut off, however fast the machine."""
    real = engine.step

    engine.step = lambda: time.sleep(seconds) or real()
    try:
        yield
    finally:
        engine.step = real
