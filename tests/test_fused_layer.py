"""The fused native decoder layer (kernels/layer.c via models/llama_native.py): every forward kind
(prefill, decode, verify chain, padded batch, tree, captured layers) gives the bits of the module
path it replaces, for the Llama, Qwen2 (q/k/v bias) and Qwen3 (q/k norm) variants, int4 and int8
weights, bfloat16 and float32 caches, on the AVX512 and the AVX2 body; and it runs only where it may."""
from __future__ import annotations

import pytest
import torch

import specdecode.models.llama_native as llama_native
from specdecode.kernels import native_kernels
from specdecode.runtime import attention
from specdecode.runtime.kv_cache import KVCache
from specdecode.runtime.model_runner import ModelRunner
from test_quantized_model import quantized
from tiny_models import hf_model

pytestmark = pytest.mark.skipif(native_kernels() is None, reason="native kernels unavailable here")

TREE = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)


def _runner(model, cache_dtype, backend="cpu-native"):
    cfg = model.cfg
    kv = KVCache(cfg.num_layers, 3, 96, cfg.num_kv_heads, cfg.head_dim, cache_dtype)
    return ModelRunner(model, kv, attention.backend(backend))


def _script(runner):
    """A sequence of forwards of every kind, committing as an engine would; returns every output."""
    kv, out = runner.kv, []
    a, b = kv.allocate(), kv.allocate()
    prompt = list(range(7, 40))

    def fwd(*args, **kw):
        logits, hidden, captured = runner.forward(*args, **kw)
        out.extend([t for t in (logits, hidden, *[captured[i] for i in sorted(captured)]) if t is not None])

    fwd([a], [prompt], capture_layers=(0, 2))  # prefill, with captured hidden states (EAGLE's taps)
    kv.set_length(a, len(prompt))
    fwd([a], [[5]], last_only=True)  # decode (the one-token path)
    fwd([a], [[6]], packed_logits=True)  # a plain verify
    fwd([a], [[7]], [[len(prompt) + 9]])  # a position past the cache length (a draft model after a skip)
    fwd([a], [[8]], logits=False)
    fwd([a], [[5, 6, 7, 8, 9]], row_exact=True)  # verify a chain
    kv.set_length(a, len(prompt) + 3)
    L = kv.lengths[a]
    fwd([a], [[40, 99, 41, 42]], [[L, L + 1, L + 1, L + 2]], TREE[None], row_exact=True)  # verify a tree
    fwd([a, b], [[11, 12], list(range(50, 59))])  # a padded batch: a decodes, b prefills
    return out


def _both_paths(model, cache_dtype):
    calls = []
    real, real_one = llama_native.Batch.layers, llama_native._Lean.run

    def counting(self, x, capture):
        calls.extend(range(len(self.ops)))
        return real(self, x, capture)

    def counting_one(self, *args):
        calls.extend(range(len(self.ops)))
        return real_one(self, *args)

    llama_native.Batch.layers, llama_native._Lean.run = counting, counting_one
    try:
        fused = _script(_runner(model, cache_dtype))
    finally:
        llama_native.Batch.layers, llama_native._Lean.run = real, real_one
    model._native.begin = model._native.few_tokens = lambda *a, **k: None  # the module path
    try:
        modules = _script(_runner(model, cache_dtype))
    finally:
        del model._native.begin, model._native.few_tokens
    return fused, modules, calls


@pytest.mark.parametrize("arch,quant", [("llama", "int4"), ("qwen2", "int4"), ("qwen3", "int4"), ("qwen2", "int8")])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float32])
def test_fused_layers_give_the_bits_of_the_module_path(arch, quant, cache_dtype):
    model = quantized(hf_model(arch), quant)
    fused, modules, calls = _both_paths(model, cache_dtype)
    assert len(calls) == 8 * model.cfg.num_layers  # every forward of the script ran fused
    assert len(fused) == len(modules)
    for i, (f, m) in enumerate(zip(fused, modules)):
        assert torch.equal(f, m), i


def test_avx2_body_gives_the_bits_of_its_module_path(monkeypatch):
    monkeypatch.setenv("SPECDECODE_NATIVE_FLAGS", "-mno-avx512f")  # as a user would run the AVX2 body
    native_kernels.cache_clear()
    try:
        assert native_kernels().isa.startswith("avx2")
        model = quantized(hf_model("qwen2"), "int4")  # its layers take the AVX2 build
        fused, modules, calls = _both_paths(model, torch.bfloat16)
        assert calls
        for i, (f, m) in enumerate(zip(fused, modules)):
            assert torch.equal(f, m), i
    finally:
        monkeypatch.delenv("SPECDECODE_NATIVE_FLAGS")
        native_kernels.cache_clear()


def test_lean_forwards_give_the_bits_of_the_batched_path():
    """One sequence's lean path (NativeForward.few_tokens: decode steps, short verifies) against the
    same forwards through begin's: every logits shape, captured layers, positions given, chains and
    trees of 1-5 tokens, a prompt's first chunk, two slots in turns, and a context that outgrows the
    rotary tables' first 256 rows."""
    model = quantized(hf_model("qwen2"), "int4")
    out, lean_calls = {}, []
    real_run = llama_native._Lean.run

    def counting(self, kv, model, slot, tokens, *args):
        lean_calls.append(len(tokens))
        return real_run(self, kv, model, slot, tokens, *args)
    for lean in (True, False):
        if lean:
            llama_native._Lean.run = counting
        else:
            model._native.few_tokens = lambda *a, **k: None
        try:
            runner = _runner(model, torch.bfloat16)
            kv, got = runner.kv, []
            a, b = kv.allocate(), kv.allocate()
            runner.forward([a], [list(range(3, 14))], logits=False)  # a short prompt: lean too
            kv.set_length(a, 11)
            runner.forward([b], [list(range(3, 61))], logits=False)  # longer than LEAN_ROWS: batched
            kv.set_length(b, 58)
            for i in range(40):
                slot = (a, b)[i % 2]
                L = kv.lengths[slot]
                T = 1 + (i // 2) % 5
                tokens = [(7 * i + 3 * t) % 97 for t in range(T)]
                kw = [dict(last_only=True), dict(packed_logits=True), dict(), dict(logits=False)][i % 4]
                pos, mask = None, None
                if i % 3 == 0:  # past 256: the tables grow
                    pos = [[L + 250 + t for t in range(T)]]
                elif i % 3 == 1 and T >= 3:  # a tree: nodes 1 and 2 siblings at one depth
                    mask = TREE[:T, :T][None] if T <= 4 else torch.ones(1, T, T, dtype=torch.bool).tril()
                    depths = [0, 1, 1, 2, 3][:T]
                    pos = [[L + d for d in depths]]
                capture = [(), (0,), (model.cfg.num_layers - 1, 0)][i % 3]  # taps; the last one: pre-norm
                logits, hidden, captured = runner.forward([slot], [tokens], pos, mask, capture_layers=capture, **kw)
                assert sorted(captured) == sorted(capture)
                got += [hidden, *[captured[j] for j in sorted(captured)]] + ([] if logits is None else [logits])
                kv.set_length(slot, L + 1)  # commit the first token, as a rejected draft would
            out[lean] = got
        finally:
            llama_native._Lean.run = real_run
            model._native.__dict__.pop("few_tokens", None)
    assert len(lean_calls) == 41 and max(lean_calls) == 11  # every forward but b's prompt ran lean
    assert len(out[True]) == len(out[False])
    for i, (x, y) in enumerate(zip(out[True], out[False])):
        assert x.shape == y.shape and torch.equal(x, y), i


def test_lean_operands_are_kept_per_cache_and_dropped_with_it():
    """Two runners over one model (two engines sharing a target) each keep their operands; a cache that
    is gone takes its operands with it."""
    import gc

    model = quantized(hf_model("qwen2"), "int4")
    runners = [_runner(model, torch.bfloat16) for _ in range(2)]
    for r in runners:
        slot = r.kv.allocate()
        r.forward([slot], [[1, 2, 3]], logits=False)
        r.kv.set_length(slot, 3)
    kept = []
    for r in runners * 2:
        r.forward([0], [[4]], logits=False)
        kept.append(model._native._lean[r.kv])
    assert kept[0] is kept[2] and kept[1] is kept[3] and kept[0] is not kept[1]
    del runners, r, kept
    gc.collect()
    assert len(model._native._lean) == 0


def test_file_embedding_row_is_forwards_row():
    from specdecode.layers.embedding import FileEmbedding

    table = torch.randn(50, 16)
    reads = []

    def read_rows(ids):
        reads.append(list(ids))
        return table[torch.as_tensor(ids)].clone()
    emb = FileEmbedding(50, 16, read_rows, cache_bytes=3 * 16 * 4)  # three rows cached
    for t in (4, 4, 9, 4, 11, 12, 9, 30):
        assert torch.equal(emb.row(t), table[t])
        assert torch.equal(emb(torch.tensor([[t]]))[0, 0], table[t])
    assert len(emb._cache) == 3 and reads.count([4]) == 1  # hits move to the end; the oldest go


def test_runs_only_where_it_gives_the_same_bits():
    """Float weights, the SDPA backend or a forward that needs gradients take the module path."""
    hf = hf_model("qwen2")
    cases = [(quantized(hf, "none"), "cpu-native"), (quantized(hf, "int4"), "torch-sdpa")]
    for model, backend in cases:
        runner = _runner(model, torch.float32, backend)
        ctx_seen = []
        real = model._native.begin
        model._native.begin = lambda *a, **k: ctx_seen.append(real(*a, **k)) or ctx_seen[-1]
        runner.forward([runner.kv.allocate()], [[1, 2, 3]])
        assert ctx_seen == [None], backend


def test_silu_mul_matches_pytorch():
    """The SiLU x up both paths share: within a few ulp of PyTorch's, over the range that matters."""
    g = torch.Generator().manual_seed(0)
    gu = torch.cat([torch.randn(7, 64, generator=g) * 6, torch.randn(7, 64, generator=g)], -1)
    gu[0, :8] = torch.tensor([0.0, -0.0, 80.0, -80.0, 1e-30, -1e-30, 20.0, -20.0])
    got = native_kernels().silu_mul(gu)
    want = torch.nn.functional.silu(gu[:, :64]) * gu[:, 64:]
    torch.testing.assert_close(got, want, rtol=3e-6, atol=1e-30)


def test_silu_mul_avx2_body_gives_the_same_bits():
    """The AVX512 body takes SwiGLU 16 lanes at a time (exp16) and the AVX2 body 8 (exp8): every element
    gets the same bits, over spans with 16-lane blocks and 8-lane tails, exp's underflow, signed zeros,
    infinities and NaN."""
    from specdecode.kernels import load_native_kernels

    try:
        avx2 = load_native_kernels(("-mno-avx512f",))
    except (OSError, RuntimeError) as e:
        pytest.skip(f"AVX2 body does not build here: {e}")
    g = torch.Generator().manual_seed(1)
    I = 72  # two threads: spans of 40 and 32 elements a row
    gu = torch.cat([torch.randn(5, I, generator=g) * 8, torch.randn(5, I, generator=g)], -1)
    gu[0, :12] = torch.tensor([0.0, -0.0, 80.0, -80.0, 90.0, -90.0, 1e-30, -1e-30, float("inf"), float("-inf"),
                               float("nan"), -87.5])
    a, b = native_kernels().silu_mul(gu), avx2.silu_mul(gu)
    nan = a.isnan()  # a NaN's sign bit follows the compiler's operand order: NaN is all that is asked of it
    assert torch.equal(nan, b.isnan()) and nan.any()  # silu(-inf) and silu(nan)
    assert torch.equal(a.view(torch.int32)[~nan], b.view(torch.int32)[~nan])  # every other bit, signed zeros too


def test_a_ragged_batch_runs_its_layers_on_its_real_rows_only(monkeypatch):
    """Drafts of different lengths verified together: the layers see sum(num_new) packed rows, not B x T,
    and every real row gets the bits it gets alone; padding comes back zero (logits, hidden, captured)."""
    model = quantized(hf_model("qwen2"), "int4")
    runner = _runner(model, torch.bfloat16)
    kv = runner.kv
    a, b, c = kv.allocate(), kv.allocate(), kv.allocate()
    for slot, prompt in ((a, list(range(7, 30))), (b, list(range(40, 52))), (c, list(range(60, 75)))):
        runner.forward([slot], [prompt], logits=False)
        kv.set_length(slot, len(prompt))
    rows = []
    real = type(native_kernels()).decoder_layers

    def recording(self, layers, kc, vc, first, stop, batch, *args):
        rows.extend([batch.N] * (stop - first))
        return real(self, layers, kc, vc, first, stop, batch, *args)

    tokens = [[5], [6, 7, 8, 9, 10], [11, 12]]
    with monkeypatch.context() as m:
        m.setattr(type(native_kernels()), "decoder_layers", recording)
        logits, hidden, captured = runner.forward([a, b, c], tokens, capture_layers=(0,))
    assert rows == [8] * model.cfg.num_layers  # 1 + 5 + 2, not 3 x 5, in every layer
    assert runner.last_rows == 8  # what the controller's cost model observes
    for i, (slot, toks) in enumerate(zip((a, b, c), tokens)):
        alone, h_alone, cap_alone = runner.forward([slot], [toks], capture_layers=(0,))
        n = len(toks)
        assert torch.equal(logits[i, :n], alone[0]) and torch.equal(hidden[i, :n], h_alone[0])
        assert torch.equal(captured[0][i, :n], cap_alone[0][0])
        assert not logits[i, n:].any() and not hidden[i, n:].any() and not captured[0][i, n:].any()
    # packed: the real rows only, sequence after sequence, the same bits (what a speculative step reads)
    packed, _, _ = runner.forward([a, b, c], tokens, packed_logits=True)
    assert packed.shape == (8, logits.shape[-1])
    assert torch.equal(packed, torch.cat([logits[i, :len(t)] for i, t in enumerate(tokens)]))
    same, _, _ = runner.forward([a, b], [[5, 6], [7, 8]], packed_logits=True)  # not ragged: [B x T, V]
    dense, _, _ = runner.forward([a, b], [[5, 6], [7, 8]])
    assert torch.equal(same, dense.flatten(0, 1))
