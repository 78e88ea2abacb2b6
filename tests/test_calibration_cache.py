"""A target's verify cost curve saved by one engine and taken by the next (engine/calibration_cache.py):
taken under the same key without a forward of its own, and discarded when the next engine's first
verify forwards disagree with it, so that the engine after that measures its own."""
import json
import os
from types import SimpleNamespace

from specdecode.engine.calibration_cache import (CHECK_CONTEXT, CHECK_STEPS, DRIFT, CalibrationCache, calibration_key,
                                                 engine_cache)

POINTS = list(range(1, 10)) + [16, 17]  # tiny_llm("ngram", ngram_size_m=16): verify sizes up to 17


class ScriptedHost:
    """Times the planner's forwards as a host would whose forward over t tokens costs ``scale`` * t ms
    (deterministic, unlike a tiny model's microseconds), and records the forwards' sizes."""

    def __init__(self, engine, scale: float = 1.0):
        self.scale, self.sizes = scale, []
        forward = engine.runner.forward

        def counting(slots, tokens, *a, **k):
            self.sizes.append(len(tokens[0]))
            return forward(slots, tokens, *a, **k)

        engine.runner.forward = counting
        engine.planner.timer = self

    def best_of(self, fn, reps: int = 3) -> float:
        for _ in range(reps):
            fn()
        return self.scale * 1e-3 * self.sizes[-1]


def calibrated(cache, scale=1.0):
    """A fresh tiny engine's calibration with ``cache``: (forward sizes, the planner's curve, planner)."""
    from tiny_models import tiny_llm

    eng = tiny_llm("ngram", ngram_size_m=16).engine
    eng.planner.cache = cache
    host = ScriptedHost(eng, scale)
    eng.planner.calibrate(eng.runner, eng.kv, eng.prefix_cache)
    return host.sizes, {t: s for (b, t), s in eng.planner.costs.v.items()}, eng.planner


def verify_steps(planner, tokens: int, seconds: float, n: int, context: int = 100) -> None:
    """n verify forwards of one sequence over ``tokens`` tokens after ``context`` tokens, as the engine
    reports them."""
    for _ in range(n):
        timing = SimpleNamespace(verify_rows=tokens, verify_s=seconds, propose_s=0.0)
        planner.observe(1, [], timing, 0.0, merged=False, context=context)


def test_the_next_engine_takes_the_saved_curve_without_a_forward(tmp_path):
    cache = CalibrationCache({"model": "m", "threads": 2}, tmp_path)
    measured = [32] + [t for t in range(1, 10) for _ in range(2)] + [16, 17]
    sizes, curve, _ = calibrated(cache)
    assert sizes == measured and curve == {t: 1e-3 * t for t in POINTS}
    assert cache.load(POINTS) == curve  # saved
    sizes, again, planner = calibrated(CalibrationCache({"model": "m", "threads": 2}, tmp_path))
    assert sizes == [] and again == curve  # read, nothing run before the first token
    verify_steps(planner, 3, 1e-3 * 3 * DRIFT * 0.9, CHECK_STEPS)  # slower, but within DRIFT: kept
    assert cache.load(POINTS) == curve


def test_a_curve_the_first_forwards_contradict_is_discarded(tmp_path):
    cache = CalibrationCache({"model": "m"}, tmp_path)
    calibrated(cache)
    _, _, planner = calibrated(cache)
    verify_steps(planner, 2, 1e-3 * 2 * DRIFT * 2, CHECK_STEPS, context=CHECK_CONTEXT + 1)  # long contexts...
    assert cache.load(POINTS) is not None  # ...do not check it (their attention alone may be that slow)
    verify_steps(planner, 2, 1e-3 * 2 * DRIFT * 1.1, CHECK_STEPS - 1)  # the host got slower...
    assert cache.load(POINTS) is not None  # ...but CHECK_STEPS forwards decide, not fewer
    verify_steps(planner, 2, 1e-3 * 2 * DRIFT * 1.1, 1)
    assert cache.load(POINTS) is None and not cache.path.exists()
    sizes, curve, _ = calibrated(cache, scale=DRIFT * 1.1)  # the next engine measures and saves its own
    assert len(sizes) == 1 + 2 * 9 + 2 and cache.load(POINTS) == curve


def test_another_key_a_partial_or_a_broken_file_is_no_curve(tmp_path):
    cache = CalibrationCache({"model": "m", "threads": 2}, tmp_path)
    cache.save({t: 1e-3 * t for t in POINTS})
    assert CalibrationCache({"model": "m", "threads": 1}, tmp_path).load(POINTS) is None
    assert cache.load(POINTS + [33]) is None  # a longer draft cap needs a size it lacks
    cache.path.write_text("{not json")
    sizes, curve, _ = calibrated(cache)  # measured as without a cache, and saved over the broken file
    assert len(sizes) == 21 and json.loads(cache.path.read_text())["key"] == cache.key


def test_the_key_follows_the_model_file_and_how_it_runs(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights")
    key = calibration_key(f, quant="int4", threads=2)
    assert calibration_key(f, quant="int4", threads=2) == key
    assert calibration_key(f, quant="int8", threads=2) != key
    assert calibration_key(f, quant="int4", threads=1) != key
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file replaced: another model
    assert calibration_key(f, quant="int4", threads=2) != key
    a = engine_cache(f, "int4", "torch.float32", "torch.bfloat16", "cpu", "cpu-native")
    assert a.key["threads"] >= 1 and "kernels" in a.key and a.path.parent.name == "costs"


def test_engines_with_a_handed_in_model_or_the_flag_off_keep_no_cache():
    from specdecode.args import engine_config
    from specdecode.cli import build_parser
    from tiny_models import tiny_llm

    assert tiny_llm("ngram").engine.planner.cache is None  # no model file to key it on
    a = build_parser().parse_args(["generate", "-p", "x", "--no-calibration-cache"])
    assert engine_config(a).spec.calibration_cache is False
    assert engine_config(build_parser().parse_args(["generate", "-p", "x"])).spec.calibration_cache is True
