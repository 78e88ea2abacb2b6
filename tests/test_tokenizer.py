"""Tokenizers from GGUF and HF directories agree with `tokenizers`/transformers; chat templates render
as transformers renders them; streaming detokenization equals decode() and never shows broken UTF-8."""
import json
import random
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models
from tokenizers import pre_tokenizers as P, trainers

from specdecode.errors import InvalidRequestError, ModelFileError, UnsupportedModelError
from specdecode.tokenizer import StreamingDetokenizer, Tokenizer, apply_chat_template, gguf_metadata

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CODE = ('def fibonacci(n):\n    """Return F(n)."""\n    if n < 2:\n\t\treturn n\n'
        '    return fibonacci(n - 1) + fib(n-2)  # 1234567\r\n')
TEXT = ("The quick brown fox doesn't jump; it's 3.14159 times faster, they'll say. I'M SURE we've won $1,000,000!\n"
        "naïve café résumé Ångström über straße — “quotes” «guillemets» 你好，世界！今天天气很好。日本語のテキスト 한국어 "
        "Россия Україна مرحبا 🤖🎉👩‍👩‍👧 ❤️\n" + CODE + "x = {'a': [1, 2, 3]}\nprint(f\"{x!r:>10}\")   \n\n\n  tail  ")
SAMPLES = [TEXT, CODE, "   leading\n\n  and trailing   ",
           "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
           "a<think>b</think> <|endoftext|>x", "\u00a0\u2003nbsp\u200bzero 0000000000 ½ ²", "🤖🤖 你好你好 é" * 3, ""]
rng = random.Random(0)
SAMPLES += ["".join(rng.choice("abé你 \n\t0123456789.,'\"!?<>|_-🤖") for _ in range(rng.randint(1, 30)))
            for _ in range(100)]


def _pre(pre: str):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import _LLAMA3_SPLIT
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2

    # What each model family's own tokenizer.json uses (the reference our GGUF path must reproduce).
    bl = lambda regex: P.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=regex)  # noqa: E731
    return {"gpt2": bl(True), "smollm": P.Sequence([P.Digits(individual_digits=True), bl(True)]),
            "qwen2": P.Sequence([P.Split(Regex(QWEN2), behavior="isolated"), bl(False)]),
            "llama-bpe": P.Sequence([P.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"), bl(False)])}[pre]


def train(pre: str = "qwen2", vocab_size: int = 700) -> HFTokenizer:
    tok = HFTokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    tok.pre_tokenizer, tok.decoder = _pre(pre), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=P.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT, CODE] * 3 + SAMPLES[1:], trainer)
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False)])
    return tok


def write_gguf(tok: HFTokenizer, path, pre="qwen2", add_bos=False, template=None, eot=None, merges=None,
               stored: dict[int, str] | None = None):
    """``stored``: token id -> the text written for it instead of its vocabulary entry."""
    model = json.loads(tok.to_str())["model"]
    added = {t.content: t for t in tok.get_added_tokens_decoder().values()}
    tokens = [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
    types = [gguf.TokenType.NORMAL if t not in added else gguf.TokenType.CONTROL if added[t].special
             else gguf.TokenType.USER_DEFINED for t in tokens]
    tokens = [(stored or {}).get(i, t) for i, t in enumerate(tokens)]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre(pre), w.add_token_list(tokens), w.add_token_types(types)
    w.add_token_merges(merges or [m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    w.add_bos_token_id(tok.token_to_id("<|endoftext|>")), w.add_eos_token_id(tok.token_to_id("<|endoftext|>"))
    w.add_add_bos_token(add_bos)
    if template:
        w.add_chat_template(template)
    if eot is not None:
        w.add_eot_token_id(eot)
    w.add_tensor("tiny", np.zeros(4, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def assert_same(ours: Tokenizer, ref: HFTokenizer):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=ref)
    assert ours.vocab_size == ref.get_vocab_size()
    assert all(ours.id_to_piece(i) == ref.id_to_token(i) for i in range(ours.vocab_size))
    for s in SAMPLES:
        ids = ours.encode(s, add_special_tokens=False)
        assert ids == ref.encode(s).ids == fast.encode(s, add_special_tokens=False), s
        assert ours.decode(ids) == s == fast.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    want = [ref.token_to_id("<|im_start|>"), *ref.encode("user").ids, ref.token_to_id("<|im_end|>"),
            ref.token_to_id("<think>")]
    assert ours.encode("<|im_start|>user<|im_end|><think>") == want  # matched whole, not split into pieces


@pytest.mark.parametrize("pre", ["qwen2", "smollm", "gpt2", "llama-bpe"])
def test_gguf_tokenizer_matches_original(tmp_path, pre):
    ref = train(pre)
    assert_same(Tokenizer.from_gguf(write_gguf(ref, tmp_path / "t.gguf", pre)), ref)


def test_a_normal_token_stored_as_its_text_is_spelled_back(tmp_path):
    """A file may store a byte-level token as the text it stands for (" the" for "Ġthe"): the vocabulary
    spells it back in the byte alphabet, as transformers does, so the tokenizer is the reference's."""
    ref = train()
    pieces = {i: ref.id_to_token(i) for i in range(ref.get_vocab_size())}
    ids = [i for i, p in pieces.items() if p.startswith("Ġ") and len(p) > 3]
    stored = {i: ref.decode([i]) for i in ids[:5]}  # "Ġthe" -> " the"
    assert all(t.startswith(" ") for t in stored.values())
    assert_same(Tokenizer.from_gguf(write_gguf(ref, tmp_path / "t.gguf", stored=stored)), ref)


def test_gguf_special_ids_bos_and_template(tmp_path):
    ref = train()
    eot = ref.token_to_id("<|im_end|>")
    path = write_gguf(ref, tmp_path / "t.gguf", add_bos=True, template="{{ bos_token }}hi", eot=eot)
    ours = Tokenizer.from_gguf(gguf.GGUFReader(str(path)))  # a reader the weight loader already opened
    bos = ref.token_to_id("<|endoftext|>")
    assert ours.bos_id == bos and ours.eos_ids == {bos, eot} and ours.chat_template == "{{ bos_token }}hi"
    assert ours.encode("hi") == [bos] + ref.encode("hi").ids and ours.encode("hi", False) == ref.encode("hi").ids
    # The weight loader's parsed file (anything with .metadata; numeric arrays may be numpy) works too.
    meta = gguf_metadata(gguf.GGUFReader(str(path)))
    meta["tokenizer.ggml.token_type"] = np.array(meta["tokenizer.ggml.token_type"], np.int32)
    parsed = Tokenizer.from_gguf(SimpleNamespace(metadata=meta))
    assert parsed.encode(TEXT) == ours.encode(TEXT) and parsed.eos_ids == ours.eos_ids


def test_hf_dir_matches_original(tmp_path):
    from transformers import PreTrainedTokenizerFast

    ref = train()
    fast = PreTrainedTokenizerFast(tokenizer_object=ref, eos_token="<|im_end|>", bos_token=None)
    fast.chat_template = CHATML
    fast.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    ours = Tokenizer.from_hf_dir(tmp_path)
    assert_same(ours, ref)
    assert ours.chat_template == CHATML and ours.bos_id is None and ours.eos_ids == {0, 2}


def test_errors_are_one_line(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file at all")
    for path in (tmp_path / "missing.gguf", tmp_path / "x.gguf"):
        with pytest.raises(ModelFileError):
            Tokenizer.from_gguf(path)
    with pytest.raises(ModelFileError):
        Tokenizer.from_hf_dir(tmp_path)
    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'nonesuch'"):
        Tokenizer.from_gguf(write_gguf(train(), tmp_path / "t.gguf", pre="nonesuch"))
    bad = train()
    bad.add_tokens(["zz"])  # written as a merge below, but "zz" is a token and its halves are not
    with pytest.raises(ModelFileError, match="cannot be built"):
        Tokenizer.from_gguf(write_gguf(bad, tmp_path / "b.gguf", merges=["zz qq"]))


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
          " + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Exercises what the environment must provide: tojson, namespace, loop controls, dict, bos/eos, tools.
RICH = """{%- set ns = namespace(n=0) -%}{{ bos_token }}
{%- if tools %}<tools>{{ tools | tojson(indent=2) }}</tools>{% endif %}
{%- for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}
  <{{ m.role }}>{{ m.content | trim }}{% if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif %}</>
  {%- if loop.index > 5 %}{% break %}{% endif %}
{% endfor %}{{ dict(a=ns.n) | tojson }}{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}"""
MESSAGES = [{"role": "system", "content": "Be brief. <é> & \"x\""}, {"role": "user", "content": "  hi 你好 🤖 "},
            {"role": "skip", "content": "x"}, {"role": "assistant", "content": "ok", "tool_calls": None},
            {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"x": "<1>"}}]}]


@pytest.mark.parametrize("template", [CHATML, RICH])
@pytest.mark.parametrize("gen", [True, False])
def test_chat_template_matches_transformers(template, gen):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=train(), bos_token="<|endoftext|>", eos_token="<|im_end|>")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"x": "string"}}}]
    want = fast.apply_chat_template(MESSAGES, chat_template=template, tools=tools, tokenize=False,
                                    add_generation_prompt=gen)
    got = apply_chat_template(template, MESSAGES, add_generation_prompt=gen, tools=tools,
                              bos_token="<|endoftext|>", eos_token="<|im_end|>")
    assert got == want


def test_chat_template_helpers_and_errors():
    assert apply_chat_template(None, MESSAGES[:2]).endswith("<|im_end|>\n<|im_start|>assistant\n")  # ChatML
    assert apply_chat_template("{{ strftime_now('%Y') }}", []).isdigit()
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        apply_chat_template("{{ raise_exception('roles must alternate') }}", MESSAGES)
    with pytest.raises(ModelFileError):
        apply_chat_template("{% for %}", MESSAGES)
    with pytest.raises(InvalidRequestError):  # the sandbox refuses internals
        apply_chat_template("{{ messages.__class__.__mro__ }}", MESSAGES)


def test_tokenizer_chat_fallback(tmp_path):
    ours = Tokenizer.from_gguf(write_gguf(train(), tmp_path / "t.gguf"))  # ChatML tokens, no template
    assert ours.apply_chat_template(MESSAGES[:2]) == apply_chat_template(CHATML, MESSAGES[:2])
    bare = HFTokenizer(models.BPE({"a": 0}, []))
    with pytest.raises(InvalidRequestError, match="no chat template"):
        Tokenizer(bare, bos_id=None, eos_ids=[]).apply_chat_template(MESSAGES[:2])


def stream(tok: Tokenizer, ids, skip=False) -> list[str]:
    d = StreamingDetokenizer(tok, skip_special_tokens=skip)
    return [d.add(i) for i in ids] + [d.flush()]


def test_streaming_detok_byte_level(tmp_path):
    tok = Tokenizer.from_gguf(write_gguf(train(vocab_size=300), tmp_path / "t.gguf"))
    for s in SAMPLES:
        ids = tok.encode(s, add_special_tokens=False)
        for skip in (False, True):
            chunks = stream(tok, ids, skip)
            assert "".join(chunks) == tok.decode(ids, skip_special_tokens=skip)
            assert not any("\ufffd" in c for c in chunks), (s, chunks)
    ids = tok.encode("𝄞", add_special_tokens=False)  # not in the corpus: one token per UTF-8 byte
    assert len(ids) > 1 and stream(tok, ids)[:-2] == [""] * (len(ids) - 1)  # held until the last byte
    assert "".join(stream(tok, ids[:-1])) == tok.decode(ids[:-1])  # a cut-off stream ends as decode() does


def spm_gguf(tmp_path):
    # A sentencepiece-style vocabulary as llama.cpp stores it: no merges, scores rank the pieces, bytes as <0xXX>.
    from tokenizers import SentencePieceBPETokenizer

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator([TEXT, CODE] * 3, vocab_size=400, show_progress=False)
    # CJK and emoji stay out of the vocabulary, so they go through byte fallback.
    pieces = [p for p, _ in sorted(sp.get_vocab().items(), key=lambda kv: kv[1])
              if max(map(ord, p)) < 0x2E80 and p != "<unk>"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    w = gguf.GGUFWriter(str(tmp_path / "model.gguf"), "llama")
    w.add_tokenizer_model("llama"), w.add_token_list(tokens), w.add_token_types(types)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)])
    w.add_bos_token_id(1), w.add_eos_token_id(2), w.add_unk_token_id(0)
    w.add_tensor("tiny", np.zeros(4, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return tmp_path / "model.gguf"


def test_spm_gguf_matches_transformers_and_streams(tmp_path):
    from transformers import AutoTokenizer

    path = spm_gguf(tmp_path)
    ours, ref = Tokenizer.from_gguf(path), AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert ours.encode("") == ref.encode("") == [1]  # llama.cpp adds BOS for sentencepiece by default
    for s in filter(None, SAMPLES):
        # llama.cpp always puts a space in front; transformers' Metaspace does unless the text starts
        # with one. So llama.cpp's ids for s are transformers' ids for " " + s (same vocab, merges, bytes).
        assert ours.encode(s) == ref.encode(" " + s), s
        ids = ours.encode(s, add_special_tokens=False)
        assert ours.decode(ids) == ref.decode(ids, clean_up_tokenization_spaces=False) == s
        chunks = stream(ours, ids)
        assert "".join(chunks) == s and not any("\ufffd" in c for c in chunks), s
    # ... and again after a special token, which transformers ("first" prepend scheme) does not do.
    assert ours.encode("a</s>b", False) == [*ref.encode(" a", add_special_tokens=False), 2,
                                            *ref.encode(" b", add_special_tokens=False)]


def check_real_gguf(path, reference_pre=None):
    """Our GGUF tokenizer against transformers' own GGUF tokenizer loader on the same file."""
    from transformers import AutoTokenizer

    ours = Tokenizer.from_gguf(path)
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if reference_pre is not None:
        ref.backend_tokenizer.pre_tokenizer = reference_pre
    for s in SAMPLES:
        assert ours.encode(s, add_special_tokens=False) == ref.encode(s, add_special_tokens=False), s
        assert ours.decode(ours.encode(s)) == s
    return ours


@pytest.mark.integration
def test_smollm2_gguf(tmp_path):
    try:
        from specdecode.store import resolve_model

        path = resolve_model("smollm2-135m-instruct", quiet=True)
    except Exception as e:  # no store module yet, or no network to pull the file
        pytest.skip(f"SmolLM2 GGUF unavailable: {e}")
    (tmp_path / path.name).symlink_to(path)
    # transformers has no "smollm" pre-tokenizer and splits as GPT-2; SmolLM2's tokenizer.json (and
    # llama.cpp) split lone digits first, so the reference gets the model's own pre-tokenizer.
    ours = check_real_gguf(tmp_path / path.name, _pre("smollm"))
    assert [ours.piece_to_id(t) for t in SPECIALS] == [0, 1, 2] and ours.eos_ids == {0, 2}
    prompt = ours.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
