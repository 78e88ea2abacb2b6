"""--spec-type configurations on one prompt at a time, stepped in turns (one engine step each, the order
rotating every turn) over the same target weights, so that a drift of the machine's speed, which on some
hosts moves a plain step by 20 % within a minute, hits them alike; bench_vs_llamacpp.py runs whole
requests one after the other and its per-prompt ratios carry that drift. Decode time only (the steps
after the first token); every repetition starts the other configurations' drafters afresh. Prints each
configuration's speed relative to the first one's.

With --batch N, each repetition runs --requests prompts (N by default; the categories' first prompts
in turn, then their second ones, ...) on N slots, all queued at once, as a server's full batch takes
them: later prompts join as slots free and ride in the decoders' steps. Every step is timed there,
prompt forwards included (the workload's wall time, as bench-serve's throughput counts it).

A configuration may carry a variant after a colon, for A/B runs of the controller in one process:
  gate-closed     the speculation gate held closed: every step plain, with the drafters' bookkeeping
                  (what the configuration costs where it does not draft)
  optimistic      chains: every evidence class starts from the optimistic prior, not the drafter's
                  measured one (Proposer.evidence_prior)
  eagle-tree      an EAGLE head's chain (eagle-topk 1) grown by the tree path, visibility masks and all
                  (what it was before the chain path; the same drafts)
  no-share        a prompt never copies a running request's prefix (only free slots' and the prompt
                  store's serve it, as before the engine shared them)
  no-draft-share  the target shares a running request's prefix, a draft model or MTP heads do not: they
                  prefill the shared prefix again (as before they shared their state)
  merged-drafts   a step whose forward carries prompt chunks drafts as any other, as the engine did
                  before such steps drafted nothing (the gate cannot judge them)
  native-rev      its steps run on the native kernels built from --native-rev's sources (a kernel A/B
                  on whole steps: both configurations share the weights, only the library differs)
  batched-verify  a verify of one sequence runs the batched fused path (a Context and a Batch built per
                  forward), as before such verifies took the lean path (LlamaModel.few_tokens); decode
                  steps stay lean

Each repetition's line gives every configuration's mean proposal time over the steps that drafted
(``propose``) and the steps its speculation gate made plain (``gated``).

    python scripts/bench_interleaved.py --spec-types none,auto --categories roleplay,rag --reps 3
    python scripts/bench_interleaved.py --spec-types none,auto,auto:optimistic --categories qa --reps 2
    python scripts/bench_interleaved.py --spec-types none,auto --batch 8 --requests 16 --reps 3
    python scripts/bench_interleaved.py --spec-types none,none:native-rev --native-rev HEAD~1 --batch 8 \
        --requests 16 --max-tokens 96 --reps 3
    python scripts/bench_interleaved.py --spec-types draft,draft:no-draft-share --model-draft \
        qwen2.5-coder-0.5b-instruct --batch 8 --requests 16 --reps 3
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("gate-closed", "optimistic", "eagle-tree", "no-share", "no-draft-share", "merged-drafts", "native-rev",
            "batched-verify")


def variant(llm, name: str) -> None:
    """Applies a configuration's variant (module doc) to its engine."""
    eng = llm.engine
    if name == "gate-closed":
        eng.planner.gate.open = lambda batch: False
    elif name == "optimistic":
        for m in getattr(eng.proposer, "members", ()):
            m.evidence_prior = lambda c: ()
    elif name == "merged-drafts":
        eng._draft_lengths = lambda seqs, merged=False: eng.planner.lengths(seqs, eng.max_model_len)
    elif name == "no-share":
        eng._share_prefix = lambda seq: False
    elif name == "batched-verify":
        lean = eng.runner._lean
        eng.runner._lean = lambda slot, tokens, *rest: None if len(tokens) > 1 else lean(slot, tokens, *rest)
    elif name == "no-draft-share":
        from types import MethodType

        from specdecode.speculative.proposer import Proposer

        for m in [eng.proposer, *getattr(eng.proposer, "members", ())]:
            if m.name in ("draft", "draft-mtp"):
                m.share = MethodType(Proposer.share, m)
    elif name == "eagle-tree":
        from specdecode.speculative import eagle, eagle_tree

        prop = next(m for m in [eng.proposer, *getattr(eng.proposer, "members", ())]
                    if isinstance(m, eagle.EagleProposer))
        inner = prop.propose

        def propose(seqs, ks):  # this engine's proposals only: the others keep the chain path
            eagle.grow = eagle_tree._tree
            try:
                return inner(seqs, ks)
            finally:
                eagle.grow = eagle_tree.grow

        prop.propose = propose


def units(prompts: list, cats: list[str] | None, n: int) -> list[tuple[str, list]]:
    """What one repetition runs: each category's first prompt alone (n = 1), or n prompts taken from
    the categories in turn (their first prompts, then their second ones, ...)."""
    by_cat: dict[str, list] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    if n == 1:
        return [(c, by_cat[c][:1]) for c in (cats or list(by_cat))]
    order = [p for i in range(max(map(len, by_cat.values()))) for c in (cats or list(by_cat))
             for p in by_cat[c][i:i + 1]]
    if len(order) < n:
        sys.exit(f"bench_interleaved: {len(order)} prompts where {n} were asked for")
    return [(f"{n} prompts", order[:n])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--model-draft", help="a draft model for every configuration (draft, or auto's chain)")
    ap.add_argument("--spec-types", default="none,auto", help="configurations: base,other[,...], each TYPE (a "
                    "chain's members joined by '+': suffix+ngram-mod) or "
                    "TYPE:VARIANT (" + ", ".join(VARIANTS) + ")")
    ap.add_argument("--categories", help="comma-separated Spec-Bench categories, the first prompt of each "
                                         "(default: every category)")
    ap.add_argument("--prompts", default="../shared/datasets/spec_bench/question.jsonl")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="slots: prompts decoded at once (module doc)")
    ap.add_argument("--requests", type=int, help="with --batch: prompts per repetition (default: --batch)")
    ap.add_argument("--native-rev", help="the revision whose kernels the native-rev variant runs on")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode import LLM, SamplingParams
    from specdecode.bench.prompts import load_prompts

    configs = a.spec_types.split(",")
    for c in configs:
        if c.partition(":")[2] not in ("", *VARIANTS):
            sys.exit(f"bench_interleaved: unknown variant in {c!r} (known: {', '.join(VARIANTS)})")
    first, others = configs[0], configs[1:]
    remembers = {"auto", "suffix", "ngram-mod"} & set(first.partition(":")[0].replace("+", ",").split(","))
    if a.reps > 1 and remembers:  # the others are built afresh each repetition; the first is not
        sys.exit(f"bench_interleaved: the first configuration serves every repetition, and {min(remembers)} keeps "
                 "what earlier requests produced (it would draft each answer from the last repetition): put "
                 "none first, or run one repetition")
    swapped = {c for c in configs if c.partition(":")[2] == "native-rev"}
    if swapped and not a.native_rev:
        sys.exit("bench_interleaved: the native-rev variant needs --native-rev")
    seqs_cap = max(1, a.batch)
    requests = max(seqs_cap, a.requests or seqs_cap)
    kw = dict(threads=a.threads, max_num_seqs=seqs_cap, model_draft=a.model_draft)
    base = LLM(a.model, spec_type=first.partition(":")[0].replace("+", ","), **kw)
    variant(base, first.partition(":")[2])
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    base.generate([1, 2, 3, 4, 5, 6, 7, 8], warm)
    if swapped:
        from ab_native import build_at  # scripts/ is sys.path[0]

        from specdecode.kernels import native_kernels
        nk = native_kernels()
        libs = (nk.lib, build_at(a.native_rev).lib)

    def step(c: str, e) -> None:
        """One engine step, on --native-rev's library where c asks for it."""
        if c not in swapped:
            return e.step()
        object.__setattr__(nk, "lib", libs[1])  # the frozen handle every native call goes through
        try:
            e.step()
        finally:
            object.__setattr__(nk, "lib", libs[0])
    cats = a.categories.split(",") if a.categories else None
    ratios: dict[str, list[float]] = {c: [] for c in others}
    for cat, prompts in units(load_prompts(a.prompts, cats, limit=-(-requests // len(cats)) if cats else None),
                              cats, requests if seqs_cap > 1 else 1):
        ids = [base.encode_chat([{"role": "user", "content": p.text}]) for p in prompts]
        for rep in range(a.reps):
            engines = {first: base.engine}
            for c in others:
                spec, _, var = c.partition(":")
                llm = LLM(a.model, spec_type=spec.replace("+", ","), _model=base.engine.model,
                          _tokenizer=base.tokenizer, **kw)
                variant(llm, var)
                llm.generate([1, 2, 3, 4, 5, 6, 7, 8], warm)  # calibration, kernel build
                engines[c] = llm.engine
            base.engine.reset_prefix_cache()  # every configuration prefills the prompt
            seqs = {k: [e.add_request(list(x), params) for x in ids] for k, e in engines.items()}
            spent = dict.fromkeys(engines, 0.0)
            gated0 = {k: e.planner.gated_steps for k, e in engines.items()}  # the base engine serves every rep
            order = list(engines.items())
            while not all(s.finished for b in seqs.values() for s in b):
                order = order[1:] + order[:1]  # each engine runs right after each other one in turn
                for k, e in order:
                    if all(s.finished for s in seqs[k]):
                        continue
                    decoding = seqs_cap > 1 or len(seqs[k][0].output_ids) >= 1
                    t0 = time.perf_counter()
                    step(k, e)
                    if decoding:
                        spent[k] += time.perf_counter() - t0
            parts = []

            def bookkeeping(k):
                st = [s.stats for s in seqs[k]]
                n = sum(x.draft_steps for x in st)
                ms = 1e3 * sum(x.draft_time_s for x in st) / n if n else 0.0
                return f"propose {ms:.2f} ms, gated {engines[k].planner.gated_steps - gated0[k]}"
            for c in others:
                if [s.output_ids for s in seqs[first]] != [s.output_ids for s in seqs[c]]:
                    print(f"WARNING: {c} output differs from {first} on {cat}", file=sys.stderr)
                ratios[c].append(spent[first] / spent[c])
                tau = statistics.mean(s.stats.mean_acceptance_length for s in seqs[c])
                parts.append(f"{c} {spent[c]:.2f} s ({bookkeeping(c)}), {c}/{first} speed {ratios[c][-1]:.3f}, "
                             f"tau {tau:.2f}")
            print(f"{cat} rep {rep}: {first} {spent[first]:.2f} s ({bookkeeping(first)}), " + "; ".join(parts),
                  flush=True)
        for c in others:
            r = ratios[c][-a.reps:]
            print(f"{cat}: {c} median {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})", flush=True)
    for c in others:
        r = ratios[c]
        print(f"all: {c} median {statistics.median(r):.3f}, {sum(x >= 1 for x in r)}/{len(r)} >= 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
