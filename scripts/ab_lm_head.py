"""The LM head in int8 against int4 on one GGUF model (its decoder in --quant), in one process.

    python scripts/ab_lm_head.py agree --tokens 1024     # top-1 agreement and KL against float32
    python scripts/ab_lm_head.py speed                   # plain decode tok/s, twins alternating per prompt

``agree``: teacher-forced logits over the head of the standard library's textwrap.py (as
quant_agreement.py), for the float32 load of the file and for each head format. ``speed``: the 17
prompts of bench_vs_llamacpp.py, greedy, 128 tokens, end-of-sequence ignored; both models answer
each prompt, their order alternating; prints the median tok/s and the per-prompt ratio int4 / int8.
``--same`` gives both twins the loader's own choice (a null A/B: what the machine's noise alone gives)."""
from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def with_head(fmt: str | None):
    """Makes the GGUF loader give the LM head ``fmt`` (None: its own rule)."""
    import specdecode.loader.gguf_loader as gl

    if not hasattr(gl, "_own_head_quant"):
        gl._own_head_quant = gl.head_quant
    gl.head_quant = gl._own_head_quant if fmt is None else (lambda f, q: fmt)


def agree(path, quant: str, tokens: int, threads: int) -> None:
    from quant_agreement import logits_for
    from specdecode.tokenizer import Tokenizer

    torch.set_num_threads(threads)
    ids = Tokenizer.from_gguf(path).encode(Path(sysconfig.get_paths()["stdlib"], "textwrap.py").read_text(),
                                           add_special_tokens=False)[:tokens]
    ref = logits_for(path, "none", ids, threads)[0].float()
    for fmt in ("int8", "int4"):
        with_head(fmt)
        lg = logits_for(path, quant, ids, threads)[0].float()
        top1 = (lg.argmax(-1) == ref.argmax(-1)).float().mean().item()
        kl = torch.nn.functional.kl_div(torch.log_softmax(lg, -1), torch.log_softmax(ref, -1), log_target=True,
                                        reduction="none").sum(-1).mean().item()
        print(f"head {fmt}: top-1 {100 * top1:.2f} %, KL {kl:.4f} ({len(ids)} tokens)")


def speed(path, quant: str, threads: int, same: bool) -> None:
    from bench_vs_llamacpp import prompts
    from specdecode import LLM, SamplingParams

    llms = {}
    for fmt in ("int8", "int4"):
        with_head(None if same else fmt)
        llms[fmt] = LLM(str(path), spec_type="none", quant=quant, threads=threads, max_num_seqs=1)
    with_head(None)
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    for llm in llms.values():
        llm.generate([1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    tps: dict[str, list[float]] = {k: [] for k in llms}
    for i, (pid, _, ids) in enumerate(prompts(llms["int8"])):
        for fmt in (list(llms) if i % 2 == 0 else list(llms)[::-1]):
            tps[fmt].append(llms[fmt].generate(ids, params)[0].stats["decode_tokens_per_s"])
        print(pid, {k: round(v[-1], 1) for k, v in tps.items()}, file=sys.stderr, flush=True)
    q = sorted(a / b for a, b in zip(tps["int4"], tps["int8"]))
    print("median tok/s " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in tps.items())
          + f"; int4 / int8 per prompt: median {statistics.median(q):.3f} ({q[0]:.3f}-{q[-1]:.3f}), {len(q)} prompts"
          + (" (null A/B: both twins as loaded)" if same else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["agree", "speed"])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--quant", default="int4")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--same", action="store_true", help="speed: both twins as the loader builds them")
    a = ap.parse_args()
    from specdecode.store import resolve_model

    path = resolve_model(a.model)
    if a.mode == "agree":
        agree(path, a.quant, a.tokens, a.threads)
    else:
        speed(path, a.quant, a.threads, a.same)
    return 0


if __name__ == "__main__":
    sys.exit(main())
