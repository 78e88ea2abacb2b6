"""GGUF loading: files written as llama.cpp's converter writes them give transformers' logits for the
weights they decode to; bad files give one-line errors; optionally, the real SmolLM2 GGUF (llama arch,
so permuted q/k rows; Q4_1 and Q8_0 weights)."""
import dataclasses

import gguf
import numpy as np
import pytest
import torch

from gguf_fixtures import K_QUANTS, Q, encode, reference_model, write_gguf
from specdecode.runtime.kv_cache import KVCache
from specdecode.runtime.model_runner import ModelRunner
from specdecode.errors import ModelFileError, UnsupportedModelError
from specdecode.loader.gguf_file import GGUFFile, GGUFTensorInfo, gguf_tensor_infos
from specdecode.loader.gguf_loader import (auto_quant, dequantize_tensor, hf_name, iter_gguf_tensors, load_gguf_model,
                                           read_gguf_config, unpermute_rows)
from specdecode.loader.hf import config_from_hf
from specdecode.layers.rotary import rope_inv_freq  # after specdecode.models: rotary <-> models import cycle
from tiny_models import hf_model

LLAMA3 = {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192},
          # head_dim 64 and theta 5e5 as in Llama 3: three frequencies fall in the blended band
          "rope_theta": 500000.0, "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
          "max_position_embeddings": 131072}
# K-quant blocks are 256 wide: every input dim (hidden, intermediate, heads * head_dim) a multiple of 256
K_MODEL = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "head_dim": 64}


def our_logits(model, ids: torch.Tensor) -> torch.Tensor:
    cfg = model.cfg
    runner = ModelRunner(model, KVCache(cfg.num_layers, 1, 256, cfg.num_kv_heads, cfg.head_dim, model.dtype))
    return runner.forward([runner.kv.allocate()], [ids[0].tolist()])[0][0]


def check_against_transformers(hf, path, expected):
    ids = torch.randint(0, hf.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = reference_model(hf, expected)(ids).logits[0]
    # Same weights, float64 except transformers' RMSNorm (float32 inside): ~1e-7 relative on logits of a few
    # units, while a wrong name, permutation or block decode moves them by ~0.1 or more.
    torch.testing.assert_close(our_logits(load_gguf_model(path, torch.float64), ids).double(), ref,
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type,overrides", [
    ("llama", {}), ("llama", {"tie_word_embeddings": True}), ("llama", LLAMA3),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}), ("qwen2", {}),
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}),
    ("mistral", {}), ("qwen3", {}),
])
def test_f32_logits_and_config_match_transformers(tmp_path, model_type, overrides):
    hf = hf_model(model_type, dtype=torch.float64, **overrides)
    path = tmp_path / "m.gguf"
    expected = write_gguf(hf, path)
    ours, theirs = read_gguf_config(path), config_from_hf(hf.config.to_dict())
    # RoPE fields compared by the frequencies they give: llama3's come back refitted from rope_freqs.weight
    assert rope_inv_freq(ours.rope_theta, ours.head_dim, ours.rope_scaling)[0].allclose(
        rope_inv_freq(theirs.rope_theta, theirs.head_dim, theirs.rope_scaling)[0], rtol=1e-6)
    skip = {"rope_scaling"} | ({"arch", "sliding_window"} if model_type == "mistral" else set())  # GGUF: llama
    assert {k: v for k, v in dataclasses.asdict(ours).items() if k not in skip} == \
           {k: v for k, v in dataclasses.asdict(theirs).items() if k not in skip}
    check_against_transformers(hf, path, expected)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1])
def test_quantized_logits_match_transformers_on_decoded_weights(tmp_path, model_type, qtype):
    hf = hf_model(model_type, dtype=torch.float64)
    expected = write_gguf(hf, tmp_path / "m.gguf", lambda name: qtype)
    check_against_transformers(hf, tmp_path / "m.gguf", expected)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_load_reads_embedding_rows_from_the_file(tmp_path, tied, quant):
    """--quant int8/int4 keeps the (Q4_K) embedding table in the mapped file and dequantizes only the rows
    looked up: they equal the file's rows decoded in full, and the model still gives the float load's
    next tokens (within the int8/int4 weight error, see test_quantized_model.py)."""
    from specdecode.layers.embedding import FileEmbedding

    hf = hf_model("llama", dtype=torch.float64, tie_word_embeddings=tied, **K_MODEL)
    path = tmp_path / "m.gguf"
    write_gguf(hf, path, lambda name: Q.Q4_K)
    f = GGUFFile(path)
    model = load_gguf_model(f, torch.float32, quant=quant)
    assert isinstance(model.embed_tokens, FileEmbedding)
    assert not any("embed_tokens" in n for n, _ in model.named_buffers())
    info = f.tensors["token_embd.weight"]
    table = dequantize_tensor(info, f.raw(info), torch.float32)
    ids = torch.tensor([[5, 3, 5, 0, 383], [1, 2, 3, 4, 5]])
    assert torch.equal(model.embed_tokens(ids), table[ids])
    ref = load_gguf_model(path, torch.float32)
    x = torch.randint(0, 384, (1, 24), generator=torch.Generator().manual_seed(3))
    agree = (our_logits(model, x).argmax(-1) == our_logits(ref, x).argmax(-1)).float().mean()
    assert agree >= 0.9, agree


def test_file_embedding_cache_returns_the_files_rows(tmp_path):
    """Recently used rows are kept dequantized (a bounded LRU): every lookup still equals the file's
    rows, through hits, misses, repeats within a batch and evictions."""
    from specdecode.loader.gguf_loader import file_embedding

    hf = hf_model("llama", dtype=torch.float64, **K_MODEL)
    path = tmp_path / "m.gguf"
    write_gguf(hf, path, lambda name: Q.Q4_K)
    f = GGUFFile(path)
    info = f.tensors["token_embd.weight"]
    table = dequantize_tensor(info, f.raw(info), torch.float32)
    emb = file_embedding(f, torch.float32)
    emb._cache_rows = 3
    for ids in ([[5, 3, 5]], [[3, 7, 9, 11]], [[5, 0], [9, 9]], [[11, 3, 383]]):
        t = torch.tensor(ids)
        assert torch.equal(emb(t), table[t])
        assert len(emb._cache) <= 3
    assert list(emb._cache) == [3, 11, 383]  # least recently used first


@pytest.mark.parametrize("qtype,expect", [(Q.Q4_K, "int4"), (Q.Q4_0, "int4"), (Q.Q5_0, "int4"), (Q.Q5_K, "int4"),
                                          (Q.Q6_K, "int8"), (Q.Q8_0, "int8"), (Q.F16, "none")])
def test_auto_quant_picks_the_closest_runtime_format(tmp_path, qtype, expect):
    # int4 g32 stores 5.0 bits per weight, int8 ~8.0: Q5_0 (5.5) is closer to int4, Q6_K (6.6) to int8
    hf = hf_model("llama", dtype=torch.float64, **K_MODEL)
    write_gguf(hf, tmp_path / "m.gguf", lambda name: qtype)
    assert auto_quant(tmp_path / "m.gguf") == expect


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("head_type,quant,expect", [
    (Q.Q6_K, "int4", "int4"), (Q.Q4_K, "int4", "int4"),  # a head quantized for size follows the decoder
    (Q.Q6_K, "int8", "int8"), (Q.Q8_0, "int4", "int8"), (Q.F16, "int4", "int8"), (Q.Q8_0, "int8", "int8")])
def test_lm_head_format_follows_the_files_head(tmp_path, tied, head_type, quant, expect):
    """The LM head runs in the decoder's format when the file stores its head (output.weight, or the
    tied token_embd.weight) below 8 bits, else in int8; never in fewer bits than the decoder."""
    from specdecode.layers.quant import Int4Linear, Int8Linear

    hf = hf_model("llama", dtype=torch.float64, tie_word_embeddings=tied, **K_MODEL)
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    write_gguf(hf, tmp_path / "m.gguf", lambda name: head_type if name == head else Q.Q4_K)
    model = load_gguf_model(tmp_path / "m.gguf", torch.float32, quant=quant)
    assert isinstance(model.lm_head, {"int4": Int4Linear, "int8": Int8Linear}[expect])
    ref = load_gguf_model(tmp_path / "m.gguf", torch.float32)
    x = torch.randint(0, 384, (1, 24), generator=torch.Generator().manual_seed(3))
    agree = (our_logits(model, x).argmax(-1) == our_logits(ref, x).argmax(-1)).float().mean()
    assert agree >= 0.9, agree


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_mixed_k_quant_logits_match_transformers(tmp_path, model_type):
    # Every tensor a different K-quant in turn, as llama.cpp's Q4_K_M mixes Q4_K and Q6_K.
    hf = hf_model(model_type, dtype=torch.float64, **K_MODEL)
    names = list(hf.state_dict())
    expected = write_gguf(hf, tmp_path / "m.gguf", lambda name: K_QUANTS[names.index(name) % len(K_QUANTS)])
    check_against_transformers(hf, tmp_path / "m.gguf", expected)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.BF16])
def test_dequantize_matches_gguf_across_chunks_and_unpermutes_blocks(qtype):
    rows, cols = 48, 256 * 100  # 4800 K blocks / 38400 32-blocks: many chunks of the chunked loop
    stored = encode(np.random.default_rng(0).standard_normal((rows, cols), np.float32), qtype,
                    np.random.default_rng(1)).view(np.uint8).reshape(rows, -1)
    info = GGUFTensorInfo("t", qtype, (rows, cols), offset=0, nbytes=stored.nbytes, row_bytes=stored.shape[1])
    ours = dequantize_tensor(info, stored, torch.float32)
    assert torch.equal(ours, torch.from_numpy(gguf.quants.dequantize(stored, qtype)))
    # Blocks run along rows, so un-permuting stored rows then decoding = decoding then un-permuting.
    assert torch.equal(dequantize_tensor(info, unpermute_rows(stored, 4), torch.float32), unpermute_rows(ours, 4))


def test_iter_yields_hf_names_and_shapes_and_raw_access(tmp_path):
    hf = hf_model("qwen2", dtype=torch.float32)
    write_gguf(hf, tmp_path / "m.gguf", lambda name: Q.Q8_0)
    shapes = {n: tuple(t.shape) for n, t in hf.state_dict().items()}
    assert {n: tuple(t.shape) for n, t, _ in iter_gguf_tensors(tmp_path / "m.gguf")} == shapes
    infos = {i.name: (i, raw) for i, raw in gguf_tensor_infos(tmp_path / "m.gguf")}
    info, raw = infos["blk.0.attn_q.weight"]
    assert info.qtype == Q.Q8_0 and info.shape == (64, 64) and raw.shape == (64, 2 * 34) and raw.dtype == np.uint8


# -- bad input --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    write_gguf(hf_model("llama"), path)
    return path


def test_missing_and_empty_file(tmp_path):
    with pytest.raises(ModelFileError, match="no such GGUF file"):
        load_gguf_model(tmp_path / "nope.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_gguf_config(tmp_path / "empty.gguf")


def test_bad_magic_version_and_corrupt_header(tmp_path, good_file):
    data = good_file.read_bytes()
    key_end = 32 + int.from_bytes(data[24:32], "little")  # header: magic, version, counts, then key 0
    cases = {"bad magic": b"GGML" + data[4:],
             "unsupported GGUF version 7": data[:4] + (7).to_bytes(4, "little") + data[8:],
             # key 0's length made huge: the header cannot hold it
             "truncated or corrupt GGUF header": data[:24] + (1 << 60).to_bytes(8, "little") + data[32:],
             # key 0's value type made 99
             "corrupt GGUF header \\(value type 99": data[:key_end] + (99).to_bytes(4, "little") + data[key_end + 4:]}
    for message, blob in cases.items():
        (tmp_path / "bad.gguf").write_bytes(blob)
        with pytest.raises(ModelFileError, match=message) as e:
            GGUFFile(tmp_path / "bad.gguf")
        assert "\n" not in str(e.value)


def test_truncated_file_is_caught_before_reading(tmp_path, good_file):
    (tmp_path / "cut.gguf").write_bytes(good_file.read_bytes()[:-100])
    with pytest.raises(ModelFileError, match="truncated: tensor data needs"):
        load_gguf_model(tmp_path / "cut.gguf")
    (tmp_path / "cut.gguf").write_bytes(good_file.read_bytes()[:1000])  # inside the metadata
    with pytest.raises(ModelFileError, match="truncated or corrupt GGUF header"):
        load_gguf_model(tmp_path / "cut.gguf")


def test_unsupported_architecture(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="unsupported architecture 'gpt2'"):
        load_gguf_model(tmp_path / "g.gguf")


def test_unsupported_tensor_type_names_type_and_tensor(tmp_path, monkeypatch):
    hf = hf_model("llama")
    iq4 = np.zeros((64, 64 // 32 * 18), np.uint8)  # IQ4_NL: 32-value blocks of 18 bytes, unsupported here
    real = encode  # gguf-py cannot quantize IQ4_NL (it can decode it)
    monkeypatch.setattr("gguf_fixtures.encode", lambda d, q, r: iq4 if q == Q.IQ4_NL else real(d, q, r))
    write_gguf(hf, tmp_path / "m.gguf", lambda name: Q.IQ4_NL if name.endswith("o_proj.weight") else Q.F32)
    with pytest.raises(UnsupportedModelError, match="IQ4_NL \\(tensor blk.0.attn_output.weight\\)"):
        load_gguf_model(tmp_path / "m.gguf")


# -- the real thing -----------------------------------------------------------------------------------------
# 186 tokens of an English passage on the printing press ("The history of the printing press begins in the
# fifteenth century, ..."), encoded once with SmolLM2's own tokenizer; fixed so this test needs no tokenizer.
PASSAGE_IDS = [int(t) for t in """
504 1463 282 260 7510 1757 5634 281 260 35561 2070 28 645 28322 45382 28 253 4231 45956 429 6586 106 28 5276 39245
4718 1502 28 2664 29 2542 12923 284 253 10091 1757 9309 429 967 804 288 919 8289 30 2736 5897 28 7721 1130 216 33
36 37 37 28 4342 338 2905 856 325 3281 1869 5331 284 540 44838 670 411 1369 30 10043 13869 929 32422 592 5496 281
540 670 827 3822 4199 1699 1910 28 284 5711 282 2905 761 719 8057 30 378 2824 282 7510 4247 638 701 3485 28 31210
284 9167 42 43086 4891 725 2821 3112 28 5376 856 6811 10084 10017 282 253 1694 28 284 8053 6351 8739 30 21756 284
10623 3318 5655 288 1533 732 856 325 8057 28 21623 19040 284 31736 2905 28 564 260 5129 282 1941 8271 1759 288 2853
30 1428 260 20441 2070 12968 6254 281 768 1507 8820 28 284 260 9403 29 14519 32422 282 260 12249 2070 1135 10343
2905 284 2956 5057 1770 288 2743 2573 30""".split()]


def mean_nll(logits: torch.Tensor, ids: list[int]) -> float:
    return -torch.log_softmax(logits[:-1].double(), -1).gather(1, torch.tensor(ids[1:])[:, None]).mean().item()


@pytest.mark.integration
def test_smollm2_gguf_matches_transformers_and_unpermutes_qk():
    try:
        from specdecode.store import resolve_model
        path = resolve_model("smollm2-135m-instruct", quiet=True)
    except Exception as e:  # no store yet, or no network: this test is optional
        pytest.skip(f"SmolLM2 GGUF unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    import transformers

    f = GGUFFile(path)
    cfg = read_gguf_config(f)
    assert (cfg.arch, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.tie_word_embeddings) == \
        ("llama", 30, 9, 3, True)
    ids = torch.tensor([PASSAGE_IDS])
    model = load_gguf_model(f)
    ours = our_logits(model, ids)
    # transformers' Llama on our config and the same dequantized, un-permuted tensors: checks our runtime.
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True)).eval()
    reference_model(hf, {n: t for n, t, _ in iter_gguf_tensors(f)}).float()
    with torch.no_grad():
        ref = hf(ids).logits[0]
    # Both float32 with identical weights; only summation order differs, through 30 layers and 186
    # positions: measured max |diff| 5e-5 on logits up to 37. 2e-3 leaves 40x headroom yet is far below
    # what a real bug does (a wrong RoPE layout or norm moves logits by whole units).
    assert (ours - ref).abs().max().item() < 2e-3
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.99  # a near-tie may flip
    # The un-permutation itself: with llama.cpp's stored q/k row order the model still runs, but its RoPE
    # pairs the wrong dimensions and the passage becomes much less likely (measured: 3.0 vs 5.0 nats).
    model.load_weights((hf_name(i.name), dequantize_tensor(i, f.raw(i), torch.float32))
                       for i in f.tensors.values() if hf_name(i.name))
    right, wrong = mean_nll(ours, PASSAGE_IDS), mean_nll(our_logits(model, ids), PASSAGE_IDS)
    assert right < 3.5 and wrong > right + 1.0, (right, wrong)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K])
def test_int4_rows_decode_4bit_blocks_without_rounding(qtype):
    """Q4_0 / Q4_1 / Q4_K blocks are the int4 format (codes 0..15, a scale and a zero per 32 inputs):
    int4_rows reads them off the bytes, and they stand for exactly the weights gguf decodes."""
    from specdecode.loader.gguf_loader import int4_rows

    rows, cols = 32, 512
    stored = encode(np.random.default_rng(0).standard_normal((rows, cols), np.float32) * 0.05, qtype,
                    np.random.default_rng(1)).view(np.uint8).reshape(rows, -1)
    info = GGUFTensorInfo("t", qtype, (rows, cols), offset=0, nbytes=stored.nbytes, row_bytes=stored.shape[1])
    got = int4_rows(info, stored, (rows, cols))
    ref = torch.from_numpy(gguf.quants.dequantize(stored, qtype))
    assert got.group_size == 32 and got.codes.dtype == torch.uint8 and int(got.codes.max()) <= 15
    torch.testing.assert_close(got.dense(), ref, rtol=0, atol=1e-6 * float(ref.abs().max()))
    # the 16-row slices the loader takes stand for the same rows
    torch.testing.assert_close(got[16:32].dense(), ref[16:32], rtol=0, atol=1e-6 * float(ref.abs().max()))
    other = GGUFTensorInfo("t", Q.Q5_0, (rows, cols), 0, 0, 0)
    assert int4_rows(other, stored, (rows, cols)) is None


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_int4_load_keeps_the_files_4bit_weights(tmp_path, model_type):
    """A Q4_K file's weights reach the int4 layers as stored (its codes; its scales up to the layer's
    16-bit storage), through q/k un-permutation and q/k/v, gate/up packing: every int4 layer's output is
    the file's weights' within that rounding (~2e-4 relative). Dequantizing and quantizing again on a
    new min/max grid, as the loader once did, errs by 1.1-1.7 % on these weights (checked)."""
    from specdecode.layers.quant import Int4Linear

    hf = hf_model(model_type, dtype=torch.float64, **K_MODEL)
    expected = write_gguf(hf, tmp_path / "m.gguf", lambda name: Q.Q4_K)
    model = load_gguf_model(tmp_path / "m.gguf", torch.float32, quant="int4")
    parts = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    # Integers with a 127 in every group of 32: the kernel's int8 activations hold them exactly, so
    # what remains is the 16-bit rounding of scales and zeros (~1e-3).
    x = torch.randint(-127, 128, (3, 512), generator=torch.Generator().manual_seed(0)).float()
    x[:, ::32] = 127
    checked = 0
    for name, mod in model.named_modules():
        if not isinstance(mod, Int4Linear):
            continue
        stem, _, leaf = name.rpartition(".")
        full = [f"model.{stem}.{p}" for p in parts.get(leaf, (leaf,))] if stem else [name]
        w = torch.cat([expected[f"{n}.weight"] for n in full]).float()
        xi = x[:, :mod.in_features]
        with torch.no_grad():
            ref = xi @ w.T
            err = lambda y: float((y - (mod.bias if mod.bias is not None else 0) - ref).norm() / ref.norm())
            assert err(mod(xi)) < 2e-3, (name, err(mod(xi)))
            requant = Int4Linear.from_float(w, kernel=mod.kernel, group_size=32)
            assert err(requant(xi)) > 5e-3, name  # the test tells the two loads apart
        checked += 1
    assert checked == 4 * 2 + (0 if hf.config.tie_word_embeddings else 1)
