"""The draft controller with and without one of its module settings, in one process, on Spec-Bench:
every configuration runs twice, once as the code is ("auto") and once with the settings given by
``--old`` ("auto~old"), all sharing one target, every configuration on a prompt before the next prompt
(as ``specdecode bench``; the twins in ABBA order), so a drift of the machine's speed hits both
alike. Writes a bench JSON that ``scripts/spec_bench_categories.py`` reads.

    python scripts/ab_controller.py --old BACKOFF_MAX=0 --spec-types auto,eagle3 --limit 5 --turns 1 \\
        --json-out out/ab_backoff.json

``--old NAME=VALUE`` (repeatable) sets a constant of specdecode/speculative/controller.py for the
"~old" configurations' calls only."""
from __future__ import annotations

import argparse
import contextlib
import sys

from specdecode.bench.prompts import DEFAULT_PROMPTS, load_prompts
from specdecode.bench.report import summarize, write_json
from specdecode.bench.run import bench_llms, build_llms, parse_configs
from specdecode.config import EngineConfig, SpecConfig
from specdecode.sampling_params import SamplingParams
from specdecode.speculative import controller


@contextlib.contextmanager
def settings(values: dict[str, float]):
    saved = {k: getattr(controller, k) for k in values}
    for k, v in values.items():
        setattr(controller, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(controller, k, v)


class WithSettings:
    """An LLM whose generate() runs with ``values`` set in the controller module."""

    def __init__(self, llm, values: dict[str, float]):
        self._llm, self._values = llm, values

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def generate(self, *args, **kwargs):
        with settings(self._values):
            return self._llm.generate(*args, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", action="append", required=True, metavar="NAME=VALUE")
    ap.add_argument("--model", default=EngineConfig.model)
    ap.add_argument("--spec-types", default="auto,eagle3")
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS)
    ap.add_argument("--category", action="append")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--turns", type=int)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out", required=True)
    a = ap.parse_args()
    old = {}
    for item in a.old:
        name, _, value = item.partition("=")
        if not hasattr(controller, name):
            sys.exit(f"controller.py has no setting {name!r}")
        old[name] = type(getattr(controller, name))(float(value))
    specs = parse_configs(a.spec_types, SpecConfig())
    # each configuration's twin has its own engine (its own records and cost model) on the same model
    # on each prompt: A, B for the first configuration, B, A for the next, ... (drift within a prompt
    # hits both alike)
    pairs = []
    for i, (label, spec) in enumerate(specs):
        twins = [(label, spec), (label + "~old", spec)]
        pairs += twins if i % 2 == 0 else twins[::-1]
    llms = build_llms(EngineConfig(model=a.model, threads=a.threads), pairs)
    llms = {label: WithSettings(llm, old) if label.endswith("~old") else llm for label, llm in llms.items()}
    prompts = load_prompts(a.prompts, a.category, a.limit)
    meta = {"argv": sys.argv, "model": a.model, "spec_types": a.spec_types, "old": old, "max_tokens": a.max_tokens,
            "prompts": a.prompts, "n_prompts": len(prompts), "turns": a.turns or "all", "temperature": 0.0}
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    bench_llms(llms, prompts, params, progress=sys.stderr.isatty(), turns=a.turns,
               on_prompt=lambda recs: write_json(a.json_out, meta, recs, summarize(recs)))


if __name__ == "__main__":
    main()
