"""MTP heads (--spec-type draft-mtp): the module against transformers' decoder layer, GGUF nextn and HF
layouts written and read back, attach-mtp keeping every original byte, greedy output identical to plain
greedy, the one-line error for a model without heads, and training (chained passes, seeded, resumable)."""
import dataclasses
import json

import numpy as np
import pytest
import torch

from gguf_fixtures import write_gguf
from specdecode import LLM, SamplingParams
from specdecode.cli import main as cli_main
from specdecode.runtime.context import Context, use_context
from specdecode.runtime.kv_cache import KVCache
from specdecode.errors import ModelFileError
from specdecode.loader.gguf_file import GGUFFile
from specdecode.loader.gguf_loader import load_gguf_model, read_gguf_config
from specdecode.loader.hf import config_from_hf
from specdecode.loader.mtp_ckpt import attach_mtp, load_mtp_head, mtp_layer_count, save_head_dir
from specdecode.models.mtp import MTPConfig, build_mtp_head
from tiny_models import (CharTokenizer, hf_model, join_after_drafting, ours_from_hf, prefilled_chunks,
                         recomputed_positions)

GREEDY = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 100, 200, 1, 2], [42]]


def head_weights(hf, seed: int = 1, oracle: bool = False, own_head: bool = False) -> dict:
    """'layers.0.X' -> tensor. The block is layer 0 of another random model. ``oracle``: a head that predicts
    exactly what a context-free target (see context_free) predicts: block output weights zero, eh_proj
    passing the embedding half through, the target's final norm as shared-head norm."""
    other = hf_model(hf.config.model_type, seed=seed, dtype=torch.float64)
    w = {k.replace("model.layers.0.", "layers.0."): v.clone() for k, v in other.state_dict().items()
         if k.startswith("model.layers.0.")}
    H, g = hf.config.hidden_size, torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        w[f"layers.0.{norm}.weight"] = 1 + 0.1 * randn(H)
    w["layers.0.eh_proj.weight"] = randn(H, 2 * H) / (2 * H) ** 0.5
    if own_head:
        w["layers.0.shared_head.head.weight"] = randn(hf.config.vocab_size, H)
    if oracle:
        w["layers.0.self_attn.o_proj.weight"].zero_()
        w["layers.0.mlp.down_proj.weight"].zero_()
        w["layers.0.enorm.weight"].fill_(1.0)
        w["layers.0.eh_proj.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], 1).double()
        w["layers.0.shared_head.norm.weight"] = hf.model.norm.weight.detach().clone()
    return w


def make_head(hf, w: dict):
    cfg = config_from_hf(hf.config.to_dict())
    head = build_mtp_head(MTPConfig(cfg, 1, own_head="layers.0.shared_head.head.weight" in w), torch.float64)
    head.load_weights(w.items())
    return head


def context_free(hf, scale: float):
    """Scales every block's output projections: at 0 each hidden state depends on its own token only."""
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
    return hf


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_module_matches_transformers_layer(model_type):
    """Cache path (fed in chunks) == explicit path == fusion by hand + transformers' own decoder layer."""
    hf = hf_model(model_type, dtype=torch.float64)
    w = head_weights(hf, own_head=True)
    head, target = make_head(hf, w), ours_from_hf(hf, torch.float64).model
    eps = hf.config.rms_norm_eps
    T = 11
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, hf.config.vocab_size, (1, T), generator=gen)
    hidden = torch.randn(1, T, hf.config.hidden_size, generator=gen, dtype=torch.float64)
    pos = torch.arange(T)[None] + 5
    # reference: the fusion written out, then transformers' layer holding the block's weights
    other = hf_model(model_type, seed=1, dtype=torch.float64)
    e = hf.model.embed_tokens(ids)
    x = torch.cat([rms(e, w["layers.0.enorm.weight"], eps), rms(hidden, w["layers.0.hnorm.weight"], eps)], -1)
    x = x @ w["layers.0.eh_proj.weight"].T
    with torch.no_grad():
        ref = other.model.layers[0](x, position_ids=pos, position_embeddings=other.model.rotary_emb(x, pos))
    ref_logits = rms(ref, w["layers.0.shared_head.norm.weight"], eps) @ w["layers.0.shared_head.head.weight"].T
    with torch.no_grad():
        g_explicit, _, _ = head.forward_explicit(0, ids, hidden, pos, target)
    torch.testing.assert_close(g_explicit, ref, rtol=0, atol=1e-7)  # transformers' RoPE tables are float32
    kv = KVCache(1, 1, 64, hf.config.num_key_value_heads, target.cfg.head_dim, torch.float64)
    outs = []
    for a, b in ((0, 5), (5, 8), (8, 9), (9, 11)):  # incremental feeding through the cache
        with torch.no_grad(), use_context(Context(kv, [0], [a], [b - a]), torch.device("cpu")):
            outs.append(head(0, ids[:, a:b], hidden[:, a:b], pos[:, a:b], target))
    g_cache = torch.cat(outs, 1)
    torch.testing.assert_close(g_cache, g_explicit, rtol=0, atol=1e-12)
    logits = head.compute_logits(0, g_cache, target).double()  # float32 logits
    torch.testing.assert_close(logits, ref_logits, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_gguf_attach_roundtrip(tmp_path, model_type):
    hf = hf_model(model_type, dtype=torch.float64)
    src, out = tmp_path / "m.gguf", tmp_path / "m-mtp.gguf"
    write_gguf(hf, src)
    assert mtp_layer_count(src) == 0
    w = head_weights(hf)
    attach_mtp(src, make_head(hf, w), out)
    a, b = GGUFFile(src), GGUFFile(out)
    arch = a.metadata["general.architecture"]
    assert b.metadata[f"{arch}.nextn_predict_layers"] == 1
    assert b.metadata[f"{arch}.block_count"] == a.metadata[f"{arch}.block_count"] + 1
    assert set(b.metadata) - set(a.metadata) == {f"{arch}.nextn_predict_layers"}
    for k, v in a.metadata.items():  # every other entry copied with its value (and type, for numbers)
        if k != f"{arch}.block_count":
            assert np.array_equal(v, b.metadata[k]) if isinstance(v, np.ndarray) else v == b.metadata[k], k
    for name, info in a.tensors.items():  # every original tensor byte for byte
        assert np.array_equal(a.raw(info), b.raw(b.tensors[name])), name
    L = hf.config.num_hidden_layers
    assert f"blk.{L}.nextn.eh_proj.weight" in b.tensors and f"blk.{L}.attn_q.weight" in b.tensors
    assert read_gguf_config(out) == dataclasses.replace(read_gguf_config(src), num_nextn_layers=1)
    back = dict(load_mtp_head(out, dtype=torch.float64).hf_tensors())
    for name, t in w.items():  # matrices were stored as F16
        expect = t.half().double() if t.ndim > 1 else t.float().double()
        torch.testing.assert_close(back[name], expect, rtol=0, atol=0, msg=name)

    def logits(path):  # the main model ignores the MTP block
        runner = ours_from_hf(hf, torch.float64)
        runner.model = load_gguf_model(path, torch.float64)
        return runner.forward([runner.kv.allocate()], [[3, 1, 4, 1, 5, 9, 2, 6]])[0]
    torch.testing.assert_close(logits(out), logits(src), rtol=0, atol=0)


def test_hf_layout_and_head_dir(tmp_path):
    from safetensors.torch import save_file

    hf = hf_model("llama", dtype=torch.float64)
    hf.save_pretrained(tmp_path / "hf")
    L = hf.config.num_hidden_layers
    w = head_weights(hf, own_head=True)
    w["layers.0.embed_tokens.weight"] = hf.model.embed_tokens.weight.detach().clone()
    save_file({f"model.layers.{L}." + k.split(".", 2)[2]: v.contiguous() for k, v in w.items()},
              str(tmp_path / "hf" / "mtp.safetensors"))
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    assert mtp_layer_count(tmp_path / "hf") == 1
    head = load_mtp_head(tmp_path / "hf", dtype=torch.float64)
    assert head.cfg.own_head and head.cfg.own_embed
    got = dict(head.hf_tensors())
    for name, t in w.items():
        torch.testing.assert_close(got[name], t, rtol=0, atol=0, msg=name)
    save_head_dir(head, tmp_path / "head", {"base_model": "tiny"}, dtype=torch.float64)
    again = dict(load_mtp_head(tmp_path / "head", head.cfg.model, torch.float64).hf_tensors())
    assert again.keys() == got.keys() and all(torch.equal(again[k], got[k]) for k in got)
    write_gguf(hf, tmp_path / "m.gguf")  # the command, from the head directory (own head and embedding)
    assert cli_main(["attach-mtp", "--model", str(tmp_path / "m.gguf"), "--head", str(tmp_path / "head"),
                     "--out", str(tmp_path / "o.gguf")]) == 0
    back = dict(load_mtp_head(tmp_path / "o.gguf", dtype=torch.float64).hf_tensors())
    assert back.keys() == got.keys()
    assert all(torch.equal(back[k], (got[k].half() if got[k].ndim > 1 else got[k].float()).double()) for k in got)


def mtp_llm(tmp_path, scale: float, oracle: bool, **kw):
    hf = context_free(hf_model("llama", dtype=torch.float64), scale)
    src, out = tmp_path / "t.gguf", tmp_path / f"t-mtp-{oracle}.gguf"
    write_gguf(hf, src)  # F32: the file decodes to hf's weights
    attach_mtp(src, make_head(hf, head_weights(hf, oracle=oracle)), out)
    model = ours_from_hf(hf, torch.float64).model
    tok = CharTokenizer(hf.config.vocab_size)
    plain = LLM(str(src), _model=model, _tokenizer=tok, dtype="float64", max_model_len=400, max_num_seqs=3)
    spec = LLM(str(out), _model=model, _tokenizer=tok, dtype="float64", max_model_len=400, max_num_seqs=3,
               spec_type="draft-mtp", **kw)
    return plain, spec


@pytest.mark.parametrize("scale,oracle,kw", [
    (0.0, True, dict(draft_fixed=True, draft_max=4)),  # every draft right: whole chains accepted
    (0.5, True, dict(draft_fixed=True, draft_max=3, draft_p_min=0.0)),  # right part of the time
    (0.5, True, dict()),  # adaptive length (on this tiny target drafting seldom pays: mostly k = 0)
    (1.0, False, dict(draft_fixed=True, draft_max=3)),  # a random head: nearly everything rejected
])
def test_greedy_identical(tmp_path, monkeypatch, scale, oracle, kw):
    import specdecode.speculative.mtp as mtp

    monkeypatch.setattr(mtp, "PROMPT_WINDOW", 6)  # also exercises the prompt window and its restarts
    plain, spec = mtp_llm(tmp_path, scale, oracle, **kw)
    ref = [o.token_ids for o in plain.generate(PROMPTS, GREEDY)]
    for prompt, r in zip(PROMPTS, ref):
        out = spec.generate(prompt, GREEDY)[0]
        assert out.token_ids == r
        if scale == 0.0 and len(prompt) > 1:
            assert out.stats["spec"]["acceptance_rate"] == 1.0
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == ref  # batched


def test_sampled_drafts_run(tmp_path):
    _, spec = mtp_llm(tmp_path, 0.5, True, draft_fixed=True, draft_max=3, draft_p_min=0.0)
    sampled = spec.generate(PROMPTS, SamplingParams(temperature=0.8, max_tokens=20, seed=1, ignore_eos=True))
    assert all(len(o.token_ids) == 20 for o in sampled)
    assert sum(o.stats["spec"]["accepted_tokens"] for o in sampled) > 0


def test_recomputed_hidden_matches_verify_and_leaves_cache(tmp_path):
    _, spec = mtp_llm(tmp_path, 1.0, False)
    eng = spec.engine
    seq = eng.add_request(list(range(1, 40)), GREEDY)
    while seq.num_prefilled < len(seq.prompt_ids) - 1:
        eng.step()
    before = eng.kv.k.clone(), eng.kv.v.clone()
    h = eng.target.hidden_states(seq.slot, seq.tokens, 10, 38)[0]
    for now, then in zip((eng.kv.k, eng.kv.v), before):  # (entries never written may hold any bits, NaN too)
        torch.testing.assert_close(now, then, rtol=0, atol=0, equal_nan=True)
    runner = ours_from_hf(hf_model("llama", dtype=torch.float64), torch.float64)
    runner.model = eng.model
    full = runner.forward([runner.kv.allocate()], [seq.tokens[:38]], logits=False)[1][0]
    torch.testing.assert_close(h, full[10:38], rtol=0, atol=1e-10)
    eng.abort(seq)


def test_prompt_hidden_states_come_from_the_engines_prefill(tmp_path, monkeypatch):
    """The heads read the prompt's hidden states from the target's own prefill: the proposer never runs
    the target again over the prompt (it recomputes only what a prefix-cache hit skipped)."""
    from specdecode.runtime.target import Target

    plain, spec = mtp_llm(tmp_path, 0.0, True, draft_fixed=True, draft_max=4)
    ref = plain.generate(PROMPTS[0], GREEDY)[0].token_ids

    def no_recompute(*a, **kw):
        raise AssertionError("the proposer re-ran the target over the prompt")

    monkeypatch.setattr(Target, "hidden_states", no_recompute)
    out = spec.generate(PROMPTS[0], GREEDY)[0]
    assert out.token_ids == ref and out.stats["spec"]["acceptance_rate"] == 1.0


def test_prefix_cache_hit_keeps_the_heads_pairs(tmp_path, monkeypatch):
    """After a prefix-cache hit the heads resume the pairs the slot's previous request left for the
    shared tokens: the same prompt again lacks one position's hidden state (the pair the hit does not
    cover), which the engine's prefill computes again with the rest of the prompt, so the proposer
    never runs the target itself; the chat's next turn alike; the output is a cold start's."""
    plain, spec = mtp_llm(tmp_path, 0.5, True, draft_fixed=True, draft_max=3, draft_p_min=0.0)
    counts = recomputed_positions(monkeypatch)
    prompt = [(7 * i) % 300 + 1 for i in range(150)]
    first = spec.generate(prompt, GREEDY)[0]
    again = spec.generate(prompt, GREEDY)[0]
    assert counts == [] and spec.engine.prefix_cache.hit_tokens == len(prompt) - 1
    turn2 = prompt + first.token_ids + [11, 12, 13]
    second = spec.generate(turn2, GREEDY)[0]
    assert counts == []
    for p, out in ((prompt, first), (prompt, again), (turn2, second)):
        assert out.token_ids == plain.generate(p, GREEDY)[0].token_ids
    assert again.stats["spec"]["accepted_tokens"] == first.stats["spec"]["accepted_tokens"]


@pytest.mark.parametrize("stashed", [True, False])
def test_prefix_hit_from_the_store_resumes_the_heads_state(tmp_path, monkeypatch, stashed):
    """A prompt whose cached tokens come from the host prompt store brings the heads' state for them
    along (``stash``): the engine prefills again only the hit's last position, as after a slot's hit.
    Without a stash (here switched off) it prefills the heads' window of cached positions again. Either
    way the proposer runs no target forward and the output is plain greedy."""
    import specdecode.speculative.mtp as mtp

    plain, spec = mtp_llm(tmp_path, 0.5, True, draft_fixed=True, draft_max=3, draft_p_min=0.0)
    if not stashed:
        monkeypatch.setattr(spec.engine.proposer, "stash", lambda slot: None)
    prompt = [(7 * i) % 300 + 1 for i in range(300)]
    spec.generate(prompt, GREEDY)
    for j in range(3):  # three other prompts take every slot: prompt's entries move to the store
        spec.generate([(5 * i + j) % 300 + 2 for i in range(30)], GREEDY)

    counts, prefilled = recomputed_positions(monkeypatch), prefilled_chunks(monkeypatch, spec)
    again = spec.generate(prompt, GREEDY)[0]
    assert spec.engine.prefix_cache.store.hit_tokens == len(prompt) - 1
    window = len(prompt) - 1 - mtp.PROMPT_WINDOW
    assert prefilled == [(len(prompt) - 2 if stashed else window, len(prompt) - 1)]
    assert counts == [] and again.stats["spec"]["accepted_tokens"] > 0
    assert again.token_ids == plain.generate(prompt, GREEDY)[0].token_ids


def test_model_without_heads_is_a_clear_error(tmp_path):
    hf, src = hf_model("llama", dtype=torch.float64), tmp_path / "plain.gguf"
    write_gguf(hf, src)
    model = ours_from_hf(hf, torch.float64).model
    with pytest.raises(ModelFileError, match="has no MTP heads.*attach-mtp"):
        LLM(str(src), _model=model, _tokenizer=CharTokenizer(384), spec_type="draft-mtp", dtype="float64")


@pytest.mark.integration
def test_cli_without_heads_prints_one_line(capsys):
    from specdecode.store import resolve_model
    try:
        path = resolve_model("smollm2-135m-instruct", quiet=True)
    except Exception as e:  # no network: optional
        pytest.skip(f"SmolLM2 GGUF unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    assert cli_main(["generate", "--model", str(path), "--spec-type", "draft-mtp", "-p", "x", "-n", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no MTP heads" in err[0] and "attach-mtp" in err[0], err


def test_training_passes_equal_chained_drafting():
    """Pass s of training at position p == draft step s of the proposer's cache path, whose real pairs end
    at p - s + 1 (the true next tokens standing in for the drafts, as in training)."""
    from specdecode.models.mtp import chained_explicit

    hf = hf_model("llama", dtype=torch.float64)
    head, target = make_head(hf, head_weights(hf)), ours_from_hf(hf, torch.float64).model
    T, H = 12, hf.config.hidden_size
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, hf.config.vocab_size, (1, T + 1), generator=gen)
    hidden = torch.randn(1, T, H, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        passes = list(chained_explicit(head, target, ids[:, 1:], hidden, 3))
    kv = KVCache(1, 1, 64, hf.config.num_key_value_heads, target.cfg.head_dim, torch.float64)

    def run(start, tok, hid, pos):
        with torch.no_grad(), use_context(Context(kv, [0], [start], [tok.shape[1]]), torch.device("cpu")):
            return head(0, tok, hid, torch.tensor([pos]), target)[:, -1:]

    for s in (1, 2, 3):
        for p in range(s - 1, T):
            r = p - s + 1  # last real pair
            g = run(0, ids[:, 1:r + 2], hidden[:, :r + 1], list(range(r + 1)))
            for j in range(2, s + 1):  # chained steps at positions r + 1 .. p, cache entries after the real ones
                q = r + j - 1
                g = run(r + j - 1, ids[:, q + 1:q + 2], g, [q])
            torch.testing.assert_close(g[0, 0], passes[s - 1][0, p], rtol=0, atol=1e-10)


def test_train_head_is_seeded_and_resumes(tmp_path):
    import argparse

    from specdecode.train.mtp import train_mtp_head

    hf = hf_model("llama", dtype=torch.float64)
    src = tmp_path / "m.gguf"
    write_gguf(hf, src)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(20):  # characters CharTokenizer maps into the vocabulary
        (data / f"f{i}.py").write_text("".join(chr(0x21 + (i * 7 + j * j) % 90) for j in range(300)))
    model, tok = ours_from_hf(hf, torch.float32).model, CharTokenizer(384)

    def run(out, steps):
        a = argparse.Namespace(model=str(src), out=str(out), data=[str(data)], steps=steps, batch_size=2, seq_len=32,
                               echo=2, eval_every=2, save_every=2, eval_batches=1, chat_fraction=0.0, device="cpu")
        assert train_mtp_head(a, _model=model, _tokenizer=tok) == 0
        return {k: v.clone() for k, v in load_mtp_head(out / "m-mtp.gguf").state_dict().items()}

    first, again = run(tmp_path / "a", 4), run(tmp_path / "b", 4)
    assert all(torch.equal(first[k], again[k]) for k in first)  # seeded: identical heads
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["train"]["steps"] == 4 and len(cfg["train"]["heldout_top1_agreement_per_step"]["code"]) == 2
    run(tmp_path / "a", 6)  # resumes at step 4
    state = torch.load(tmp_path / "a" / "train_state.pt", weights_only=False)
    assert state["step"] == 6 and [r["step"] for r in state["history"]] == [1, 2, 3, 4, 5, 6]


def test_a_prompt_sharing_a_running_requests_prefix_takes_its_heads_state(tmp_path, monkeypatch):
    """Requests with one long prefix: one arriving with the first takes a copy of the first's pending
    hidden states with its KV (nothing of the shared prefix is prefilled again); one arriving after the
    first has drafted takes its pairs of the shared tokens and prefills again only the last shared
    position. The proposer never runs the target itself; the outputs are plain decoding's."""
    plain, spec = mtp_llm(tmp_path, 0.5, True, draft_fixed=True, draft_max=3, draft_p_min=0.0)
    counts, chunks = recomputed_positions(monkeypatch), prefilled_chunks(monkeypatch, spec)
    shared = [(7 * i) % 300 + 1 for i in range(150)]
    a, b, c = shared + [11, 12], shared + [21, 22, 23], shared + [31, 32]
    seqs = join_after_drafting(spec.engine, a, b, c, GREEDY)
    assert counts == []
    assert chunks == [(0, len(a) - 1), (len(shared), len(b) - 1), (len(shared) - 1, len(c) - 1)]
    assert [s.output_ids for s in seqs] == [plain.generate(p, GREEDY)[0].token_ids for p in (a, b, c)]
