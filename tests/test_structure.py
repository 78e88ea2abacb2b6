"""The extension points and runtime knobs of the restructured engine: registries found by module,
the attention backend seam, the Target handle, the batched accept, the lazy KV cache, config knobs,
heads as package data, and the sliding-window refusal."""
from __future__ import annotations

import dataclasses
import fnmatch
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from specdecode import SamplingParams
from specdecode.errors import InvalidRequestError, UnsupportedModelError
from tiny_models import CharTokenizer, hf_model, ours_from_hf, tiny_llm

ROOT = Path(__file__).resolve().parents[1]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


# -- registries: a new format or architecture is one module ---------------------------------------

def test_quant_formats_are_found_by_module_and_auto_picks_the_nearest():
    from specdecode.layers.quant import FORMATS, format_names, nearest_format

    assert set(FORMATS) == {"int4", "int8"} and format_names() == ("none", "int4", "int8")
    # --quant auto's thresholds: int4 (4.625 bits) up to 6.31 bits, int8 up to 12, float above. (With
    # int4 at 5.0 bits the first was 6.5: files of 6.31-6.5 bits now take int8, never fewer bits.)
    assert [nearest_format(b) for b in (4.5, 6.0, 6.3, 6.35, 6.6, 8.5, 12.0, 12.1, 16.0)] == \
        ["int4", "int4", "int4", "int8", "int8", "int8", "int8", "none", "none"]


def test_a_new_quant_format_module_is_discovered(tmp_path, monkeypatch):
    import specdecode.layers.quant as quant

    (tmp_path / "toy3.py").write_text(textwrap.dedent("""
        from specdecode.layers.quant.base import QuantFormat
        from specdecode.layers.quant.int8 import Int8Linear
        FORMAT = QuantFormat("toy3", 3.0, Int8Linear, lambda linear, kernel: None, fallback="int8")
    """))
    monkeypatch.setattr(quant, "__path__", list(quant.__path__) + [str(tmp_path)])
    try:
        found = quant._discover()
        assert set(found) == {"int4", "int8", "toy3"}
        monkeypatch.setattr(quant, "FORMATS", found)
        assert quant.nearest_format(3.2) == "toy3"
    finally:
        sys.modules.pop("specdecode.layers.quant.toy3", None)


def test_a_new_architecture_module_is_discovered_and_built(tmp_path, monkeypatch):
    import specdecode.models as models

    (tmp_path / "toyfam.py").write_text(textwrap.dedent("""
        from specdecode.models.config import Architecture
        from specdecode.models.llama import LlamaModel
        ARCHITECTURES = (Architecture("toyfam", LlamaModel, ("toyfam-gguf",), ("toyfam_hf",)),)
    """))
    monkeypatch.setattr(models, "__path__", list(models.__path__) + [str(tmp_path)])
    try:
        found = models._discover()
        assert {"llama", "mistral", "qwen2", "qwen3", "toyfam"} <= set(found)
        monkeypatch.setattr(models, "ARCHITECTURES", found)
        assert models.find_architecture("toyfam-gguf").name == "toyfam"
        assert models.find_architecture("toyfam_hf", "hf").name == "toyfam"
        cfg = dataclasses.replace(ours_from_hf(hf_model()).model.cfg, arch="toyfam")
        assert type(models.build_model(cfg)).__name__ == "LlamaModel"
    finally:
        sys.modules.pop("specdecode.models.toyfam", None)


def test_unknown_architecture_is_one_clear_error():
    from specdecode.models import find_architecture

    with pytest.raises(UnsupportedModelError, match="unsupported model_type 'gpt2'.*llama"):
        find_architecture("gpt2", "hf")


# -- attention: one entry point, a swappable backend ----------------------------------------------

def test_explicit_attend_causal_equals_a_tril_mask():
    from specdecode.runtime.attention import backend

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA: 4 query heads over 2 kv heads
    a = backend().attend(q, k, v, causal=True)
    b = backend().attend(q, k, v, torch.ones(5, 5, dtype=torch.bool).tril()[None, None])
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                           is_causal=True)
    torch.testing.assert_close(a, ref)


def test_the_engine_runs_on_the_configured_backend(monkeypatch):
    """A backend registered under a new name carries every attention of the target and the EAGLE
    head when selected; an unknown name is one clear error."""
    from specdecode.runtime import attention
    from specdecode.runtime.attention.torch_sdpa import TorchSDPABackend

    calls = []

    class Counting(TorchSDPABackend):
        name = "counting"

        def forward(self, layer, q, k, v, ctx):
            calls.append(layer)
            return super().forward(layer, q, k, v, ctx)

    monkeypatch.setitem(attention.BACKENDS, "counting", Counting)
    prompt = list(range(5, 25))
    want = tiny_llm("ngram").generate(prompt, GREEDY)[0].token_ids
    assert tiny_llm("ngram", attention_backend="counting").generate(prompt, GREEDY)[0].token_ids == want
    assert calls and set(calls) == {0, 1, 2}  # the tiny model's three layers
    with pytest.raises(InvalidRequestError, match="unknown attention backend 'nope'"):
        tiny_llm(attention_backend="nope")


# -- the proposer boundary ------------------------------------------------------------------------

def test_proposers_get_a_target_handle_and_hidden_rows_in_commit():
    """A proposer is built from a Target (never the engine), and a reads_hidden proposer receives the
    target's final states of exactly the committed rows: root + accepted path."""
    from specdecode.runtime.target import Target
    from specdecode.speculative.ngram import NgramProposer

    llm = tiny_llm("ngram", draft_fixed=True)
    eng = llm.engine
    assert isinstance(eng.target, Target) and eng.target.kv is eng.kv
    got = []

    class Reading(NgramProposer):
        reads_hidden = True

        def commit(self, seq, num_accepted, hidden):
            if not seq.finished:  # (a finished sequence may have dropped accepted tokens after its end)
                got.append((len(seq.tokens), num_accepted, hidden[0].clone()))

    prop = Reading(eng.cfg.spec)
    eng.proposer = prop
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3]  # repeats: n-gram drafts get accepted
    out = llm.generate(prompt, GREEDY)[0]
    assert any(a > 0 for _, a, _ in got)
    full = list(prompt) + out.token_ids
    ref = ours_from_hf(hf_model(dtype=torch.float64), torch.float64, max_len=400)
    ref.model = eng.model
    states = ref.forward([ref.kv.allocate()], [full], logits=False)[1][0]
    for n_tokens, a, h in got:
        assert h.shape[0] == a + 1
        torch.testing.assert_close(h, states[n_tokens - a - 2:n_tokens - 1], rtol=1e-9, atol=1e-9)


# -- the step accepts the whole batch in one call ---------------------------------------------------

def test_a_mixed_batch_gives_each_request_its_solo_output():
    """Greedy and seeded sampled requests verified together (one accept_batch call) give each the
    tokens it gets alone: greedy rows decide exactly as greedy, sampled rows draw from their own
    generators in the order a batch of one does."""
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [7, 8, 9, 7, 8, 9, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]]
    params = [GREEDY, SamplingParams(temperature=0.8, top_k=20, max_tokens=24, seed=1, ignore_eos=True),
              SamplingParams(temperature=1.0, max_tokens=24, seed=2, ignore_eos=True)]
    for spec_type, kw in (("ngram", dict(draft_fixed=True)), ("draft", dict(draft_seed=0, draft_noise=0.3,
                                                                              draft_fixed=True, draft_max=3))):
        solo = [tiny_llm(spec_type, **kw).generate(p, sp)[0].token_ids for p, sp in zip(prompts, params)]
        llm = tiny_llm(spec_type, max_num_seqs=3, **kw)
        eng = llm.engine
        seqs = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
        while eng.has_work():
            eng.step()
        assert [s.output_ids for s in seqs] == solo, spec_type


# -- the KV cache and the config knobs --------------------------------------------------------------

def test_kv_cache_touches_only_what_forwards_read():
    llm = tiny_llm("none", max_num_seqs=3)
    eng = llm.engine
    llm.generate(list(range(1, 30)), GREEDY)
    used = [s for s in range(eng.kv.num_slots) if eng.kv._clean[s]]
    assert len(used) == 1 and eng.kv._clean[used[0]] >= 29 + GREEDY.max_tokens - 1
    s = used[0]
    assert torch.isfinite(eng.kv.k[:, s, :, :eng.kv._clean[s]]).all()


def test_runtime_knobs_live_in_the_config():
    from specdecode.config import EngineConfig

    cfg = EngineConfig()
    assert (cfg.max_num_seqs, cfg.enable_prefix_caching, cfg.prefill_chunk) == (4, True, 512)
    llm = tiny_llm("none", enable_prefix_caching=False, prefill_chunk=7)
    assert llm.engine.prefix_cache is None
    seq = llm.engine.add_request(list(range(1, 20)), GREEDY)
    llm.engine.step()
    assert seq.num_prefilled == 7
    with pytest.raises(InvalidRequestError):
        EngineConfig(max_num_seqs=0)


def test_cli_flags_follow_the_config_defaults():
    from specdecode.cli import build_parser
    from specdecode.config import EngineConfig

    a = build_parser().parse_args(["serve"])
    cfg = EngineConfig()
    assert (a.max_num_seqs, a.enable_prefix_caching, a.prefill_chunk, a.attention_backend) == \
        (cfg.max_num_seqs, cfg.enable_prefix_caching, cfg.prefill_chunk, cfg.attention_backend)
    assert build_parser().parse_args(["serve", "--no-prefix-cache"]).enable_prefix_caching is False
    for cmd in (["generate", "-p", "x"], ["bench"], ["bench-serve"]):  # a model-running flag everywhere
        assert build_parser().parse_args([*cmd, "--attention-backend", "torch-sdpa"]).attention_backend == "torch-sdpa"


def test_sliding_window_caps_the_context():
    """Attention here always sees the whole prefix; a model with a sliding window therefore runs with
    its context capped at the window (where the two agree), and a longer prompt is a clear error."""
    from specdecode import LLM

    runner = ours_from_hf(hf_model(dtype=torch.float64), torch.float64)
    model = runner.model
    model.cfg = dataclasses.replace(model.cfg, sliding_window=48)
    llm = LLM(dtype="float64", max_model_len=400, _model=model, _tokenizer=CharTokenizer(model.cfg.vocab_size))
    assert llm.engine.max_model_len == 48
    with pytest.raises(InvalidRequestError, match="the context holds 48"):
        llm.generate(list(range(1, 60)), GREEDY)
    out = llm.generate(list(range(1, 40)), GREEDY)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 48 - 39


# -- heads ship as package data -------------------------------------------------------------------

def test_bundled_heads_are_package_data():
    import tomllib

    from specdecode.heads import HEADS_DIR, find_head

    assert HEADS_DIR == ROOT / "specdecode" / "heads"
    assert find_head("smollm2-135m-instruct", "eagle3") == HEADS_DIR / "smollm2-135m-instruct-eagle3"
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "specdecode.heads"]
    shipped = [p.relative_to(HEADS_DIR).as_posix() for p in HEADS_DIR.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".py"]
    assert shipped and all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in shipped), shipped
    with pytest.raises(InvalidRequestError, match="no bundled eagle3 head for 'nope'"):
        find_head("nope", "eagle3")


def test_a_built_wheel_carries_the_heads_and_kernel_sources(tmp_path):
    import subprocess
    import zipfile

    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
                        "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    names = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist()
    for head in ("smollm2-135m-instruct-eagle3/model.safetensors", "smollm2-135m-instruct-eagle3/config.json",
                 "smollm2-mtp/mtp.safetensors", "smollm2-mtp/config.json"):
        assert f"specdecode/heads/{head}" in names, head
    from specdecode.kernels import _HEADERS, _SOURCES
    for src in _SOURCES + _HEADERS:  # compiled on first use, from the installed package
        assert f"specdecode/kernels/{src.name}" in names, src.name


def test_a_missing_optional_package_is_one_line(monkeypatch, capsys):
    import specdecode.cli as cli

    def needs_matplotlib(a):
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr(cli, "cmd_models", needs_matplotlib)
    assert cli.main(["models"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib" in err[0] and "install" in err[0]


def test_a_reader_that_goes_away_ends_the_cli_quietly():
    """`specdecode ... | head`: the closed pipe ends the command with no traceback (status 141, as a
    shell reports SIGPIPE)."""
    import subprocess
    import sys

    code = ("import sys, specdecode.cli as cli\n"
            "def chatty(a):\n"
            "    for _ in range(10000): print('x' * 100)\n"
            "    return 0\n"
            "cli.cmd_models = chatty\n"
            "sys.exit(cli.main(['models']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # the reader goes away
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and err == ""
