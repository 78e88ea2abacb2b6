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
