"""The bench command's pieces: --spec-types parsing (settings per entry) and the summary's ratios."""
import pytest

from specdecode.bench.report import summarize
from specdecode.bench.run import parse_configs
from specdecode.config import SpecConfig
from specdecode.errors import InvalidRequestError


def test_spec_types_with_settings():
    base = SpecConfig(model_draft="d", draft_max=6)
    got = dict(parse_configs("ngram, eagle3(3,2,6),eagle3,draft(quant_draft=int4,draft_fixed=true,draft_p_min=0.5)",
                             base))
    assert list(got) == ["ngram", "eagle3(3,2,6)", "eagle3(3,1,4)",
                         "draft(quant_draft=int4,draft_fixed=true,draft_p_min=0.5)"]
    tree = got["eagle3(3,2,6)"]
    assert (tree.num_steps, tree.eagle_topk, tree.num_draft_tokens) == (3, 2, 6) and tree.draft_max == 6
    d = got["draft(quant_draft=int4,draft_fixed=true,draft_p_min=0.5)"]
    assert (d.spec_type, d.quant_draft, d.draft_fixed, d.draft_p_min, d.model_draft) == ("draft", "int4", True, 0.5, "d")
    for bad in ("draft(nope=1)", "draft(4)", "bogus"):
        with pytest.raises(InvalidRequestError):
            parse_configs(bad, base)


def record(cfg, cat, tokens, seconds, steps, drafted, accepted):
    return {"prompt_id": 1, "category": cat, "config": cfg, "prompt_tokens": 10, "completion_tokens": tokens + 1,
            "ttft_s": 0.1, "decode_s": seconds, "token_ids": [],
            "spec": {"steps": steps, "draft_tokens": drafted, "accepted_tokens": accepted, "draft_time_s": 0.0,
                     "verify_time_s": seconds, "accepted_per_position": [], "drafted_per_position": []}}


def test_summary_speedup_and_tau_per_category():
    recs = [record("none", "coding", 100, 10.0, 100, 0, 0), record("ngram", "coding", 100, 5.0, 40, 120, 60),
            record("none", "writing", 50, 5.0, 50, 0, 0), record("ngram", "writing", 50, 6.25, 50, 10, 0)]
    s = summarize(recs)
    assert s["coding"]["ngram"]["speedup"] == 2.0 and s["coding"]["ngram"]["tau"] == 2.5
    assert s["coding"]["ngram"]["acceptance_rate"] == 0.5
    assert s["writing"]["ngram"]["speedup"] == 0.8 and s["writing"]["ngram"]["tau"] == 1.0
    assert s["all"]["ngram"]["speedup"] == round((150 / 11.25) / (150 / 15.0), 3)


def test_prompt_files_keep_every_turn(tmp_path):
    from specdecode.bench.prompts import load_prompts
    from specdecode.errors import SpecDecodeError

    f = tmp_path / "p.jsonl"
    f.write_text('{"question_id": 7, "category": "coding", "turns": ["Write f.", "Now make it faster."]}\n'
                 '{"prompt": "Hi"}\n')
    two, one = load_prompts(f)
    assert two.turns == ("Write f.", "Now make it faster.") and two.text == "Write f."
    assert one.turns == ("Hi",) and one.category == "default"
    f.write_text('{"turns": []}\n')
    with pytest.raises(SpecDecodeError):
        load_prompts(f)


def test_multi_turn_prompts_run_as_conversations():
    # Spec-Bench runs MT-bench's second turn after the model's own first answer: one record per turn,
    # the second turn's prompt holding the first answer, and a lossless drafter's conversation equal
    # to none's turn by turn. The configurations' order reverses every other prompt (ABBA).
    from server_helpers import ChatCharTokenizer
    from tiny_models import tiny_llm

    from specdecode.bench.prompts import Prompt
    from specdecode.bench.run import bench_llms
    from specdecode.sampling_params import SamplingParams

    llms = {}
    for spec in ("none", "ngram"):
        llm = tiny_llm(spec)
        llm.engine.tokenizer = llm.tokenizer = ChatCharTokenizer(llm.tokenizer.vocab_size)
        llms[spec] = llm
    prompts = [Prompt("1", "coding", ("abcabcabc", "again: abcabc")), Prompt("2", "qa", ("xyzxyz",))]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    recs = bench_llms(llms, prompts, params, progress=False)
    assert [(r["prompt_id"], r["turn"], r["config"]) for r in recs] == [
        ("1", 0, "none"), ("1", 1, "none"), ("1", 0, "ngram"), ("1", 1, "ngram"), ("2", 0, "ngram"), ("2", 0, "none")]
    by = {(r["prompt_id"], r["turn"], r["config"]): r for r in recs}
    none = llms["none"]
    answer = none.tokenizer.decode(by[("1", 0, "none")]["token_ids"])
    second = none.encode_chat([{"role": "user", "content": "abcabcabc"}, {"role": "assistant", "content": answer},
                               {"role": "user", "content": "again: abcabc"}])
    assert by[("1", 1, "none")]["prompt_tokens"] == len(second)
    assert by[("1", 1, "none")]["token_ids"] == none.generate(second, params)[0].token_ids
    for (pid, turn, cfg), r in by.items():
        assert r["token_ids"] == by[(pid, turn, "none")]["token_ids"]
    assert [r["turn"] for r in bench_llms(llms, prompts[:1], params, progress=False, turns=1)] == [0, 0]


def test_turns_flag():
    import argparse

    from specdecode.bench.prompts import parse_turns as _turns

    assert _turns("all") is None and _turns("2") == 2
    for bad in ("0", "-1", "two"):
        with pytest.raises(argparse.ArgumentTypeError):
            _turns(bad)


def test_bench_takes_the_sampling_filters(monkeypatch, tmp_path):
    """bench's sampled runs take --top-p / --top-k / --min-p into every request's SamplingParams."""
    import specdecode.bench.report as report
    import specdecode.bench.run as run
    from specdecode.cli import main

    got = []
    monkeypatch.setattr(run, "run_bench", lambda cfg, specs, prompts, params, **kw: got.append(params) or [])
    monkeypatch.setattr(report, "summarize", lambda records: [])
    monkeypatch.setattr(report, "format_table", lambda summary: "")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    main(["bench", "--prompts", str(prompts), "--temperature", "0.7", "--top-p", "0.9", "--top-k", "40",
          "--min-p", "0.05"])
    (p,) = got
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (0.7, 0.9, 40, 0.05)


def test_bench_json_records_the_host(monkeypatch, tmp_path):
    """bench's JSON says what it ran on: the CPU, the threads its engines got, the kernels, the versions."""
    import json

    import torch

    import specdecode.bench.run as run
    from specdecode.cli import main

    monkeypatch.setattr(run, "run_bench", lambda cfg, specs, prompts, params, on_prompt=None, **kw:
                        on_prompt([]) or [])
    prompts, out = tmp_path / "p.jsonl", tmp_path / "r.json"
    prompts.write_text('{"prompt": "hi"}\n')
    assert main(["bench", "--prompts", str(prompts), "--threads", "1", "--json-out", str(out)]) == 0
    host = json.loads(out.read_text())["meta"]["host"]
    assert host["threads"] == 1 and host["cpus_usable"] >= 1 and host["torch"] == torch.__version__
    assert host["cpu"] and host["specdecode"].startswith("0.") and "platform" in host

