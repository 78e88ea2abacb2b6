"""Small random-weight Hugging Face models built in the tests, and ours loaded from the same weights."""
from __future__ import annotations

import torch

from specdecode.runtime.kv_cache import KVCache
from specdecode.runtime.model_runner import ModelRunner
from specdecode.loader.hf import config_from_hf
from specdecode.models import build_model

BASE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)


def hf_model(model_type: str = "llama", seed: int = 0, dtype=torch.float32, **overrides):
    import transformers

    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[model_type]
    kw = dict(BASE, **{"tie_word_embeddings": False, **overrides})
    if model_type == "qwen3":
        kw.setdefault("head_dim", 16)
    cfg = cls[0](**kw)
    torch.manual_seed(seed)
    m = cls[1](cfg).to(dtype).eval()
    with torch.no_grad():  # random norms and biases so that every weight matters in comparisons
        for n, p in m.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return m


def ours_from_hf(m, dtype=torch.float32, num_slots: int = 4, max_len: int = 256) -> ModelRunner:
    cfg = config_from_hf(m.config.to_dict())
    model = build_model(cfg, dtype)
    model.load_weights((n, t.to(dtype)) for n, t in m.state_dict().items())
    kv = KVCache(cfg.num_layers, num_slots, max_len, cfg.num_kv_heads, cfg.head_dim, dtype)
    return ModelRunner(model, kv)


class CharTokenizer:
    """A stand-in tokenizer for random-weight models: id i is one printable character."""

    max_piece_chars = 1  # a token is one character

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eos_ids: set[int] = set()
        self.bos_id = None
        self.chat_template = None

    def id_to_piece(self, i: int) -> str:
        return chr(0x21 + i)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.id_to_piece(i) for i in ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) - 0x21 for c in text]


def tiny_llm(spec_type: str = "none", draft_seed: int | None = None, model_type: str = "llama",
             dtype=torch.float64, max_num_seqs: int = 2, draft_noise: float = 0.0, **spec_kw):
    """An LLM over a tiny random float64 model; with draft_seed, a draft model of that seed
    (draft_seed == 0 is the target's own weights: every draft is accepted; draft_noise > 0 perturbs
    them, giving a draft that agrees with the target only part of the time)."""
    from specdecode import LLM

    hf = hf_model(model_type, dtype=dtype)
    runner = ours_from_hf(hf, dtype=dtype)
    tok = CharTokenizer(hf.config.vocab_size)
    draft = None
    if draft_seed is not None:
        d = hf_model(model_type, seed=draft_seed, dtype=dtype)
        if draft_noise:
            g = torch.Generator().manual_seed(123)
            with torch.no_grad():
                for p in d.parameters():
                    p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * draft_noise * p.std())
        draft = (ours_from_hf(d, dtype=dtype).model, CharTokenizer(d.config.vocab_size))
        spec_kw.setdefault("model_draft", "in-memory")
    name = {torch.float64: "float64", torch.float32: "float32"}[dtype]
    return LLM(spec_type=spec_type, dtype=name, max_model_len=400, max_num_seqs=max_num_seqs,
               _model=runner.model, _tokenizer=tok, _draft=draft, **spec_kw)


def recomputed_positions(monkeypatch) -> list[int]:
    """Records how many positions each Target.hidden_states call recomputes (counted, not refused: a
    step that raised would be retried plainly by the engine's failure isolation, and pass)."""
    from specdecode.runtime.target import Target

    counts, original = [], Target.hidden_states

    def counting(self, slot, tokens, start, end, *a, **kw):
        counts.append(end - start)
        return original(self, slot, tokens, start, end, *a, **kw)

    monkeypatch.setattr(Target, "hidden_states", counting)
    return counts


def prefilled_chunks(monkeypatch, eng) -> list[tuple[int, int]]:
    """Records the prompt positions (start, end) of each prefill chunk the engine of LLM ``eng`` runs."""
    chunks, e = [], eng.engine
    original = e._prefilled

    def recording(seq, end, states):
        chunks.append((seq.num_prefilled, end))
        original(seq, end, states)

    monkeypatch.setattr(e, "_prefilled", recording)
    return chunks


def join_after_drafting(engine, a: list[int], b: list[int], c: list[int], params, steps: int = 4) -> list:
    """Prompts a and b admitted together, c after ``steps`` engine steps (by which a must have drafted),
    then steps until all three finish; returns their sequences."""
    sa, sb = engine.add_request(a, params), engine.add_request(b, params)
    for _ in range(steps):
        engine.step()
    assert sa.stats.accepted_tokens > 0  # a has drafted: its drafter's state holds entries of its own
    sc = engine.add_request(c, params)
    while engine.has_work():
        engine.step()
    return [sa, sb, sc]
