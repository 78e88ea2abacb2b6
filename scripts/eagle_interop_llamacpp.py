"""Does our EAGLE-3 head run in llama.cpp, and accept as often there as here?

    python scripts/eagle_interop_llamacpp.py --llama-bin "$(../shared/peers/build-llama-cpp)" \
        --model qwen2.5-coder-1.5b-instruct

1. An HF-style directory for the target (config.json + tokenizer files) made from its GGUF with
   transformers' GGUF reader: llama.cpp's converter reads the target's config and vocabulary there.
2. The head (bundled, or --head DIR) written back in float (bfloat16) HF layout: a head stored as
   int8 rows is for our loader only.
3. ``convert_hf_to_gguf.py HEAD --target-model-dir TARGET`` from the llama.cpp tree that built
   --llama-bin, then ``llama-server -m TARGET.gguf -md HEAD.gguf --spec-type draft-eagle3``.
4. The same prompt token ids (bench_vs_llamacpp.py's set), greedy, both engines drafting a chain of
   --n-max tokens every step (ours: eagle3 (n-max, 1, n-max + 1), fixed length; theirs: --spec-draft-n-max,
   p-min 0). Prints, per prompt and overall, the share of drafted tokens each engine accepted."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from bench_vs_llamacpp import _post, _stop, prompts, theirs  # noqa: E402


def target_dir(gguf: Path, out: Path) -> Path:
    from transformers import AutoConfig, AutoTokenizer

    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return out


def float_head(head_dir: Path, target_cfg, out: Path) -> Path:
    from specdecode.loader.eagle_ckpt import load_head, save_head
    import torch

    save_head(load_head(head_dir, target_cfg), out, "hf", dtype=torch.bfloat16)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bin", required=True, help="llama.cpp's build/bin (its source tree is two levels up)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--head", help="head directory (default: the bundled head of --model)")
    ap.add_argument("--n-max", type=int, default=3, help="draft tokens per step, both engines")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out")
    a = ap.parse_args()

    from specdecode import LLM, SamplingParams
    from specdecode.heads import find_head
    from specdecode.store import resolve_model

    gguf = Path(resolve_model(a.model))
    head = Path(a.head) if a.head else find_head(a.model, "eagle3")
    bin_dir = Path(a.llama_bin).resolve()
    src = bin_dir.parents[1]
    plain = LLM(a.model, spec_type="none", threads=a.threads, max_num_seqs=1)
    ours = LLM(a.model, spec_type="eagle3", head=str(head), num_steps=a.n_max, eagle_topk=1,
               num_draft_tokens=a.n_max + 1, draft_fixed=True, threads=a.threads, max_num_seqs=1,
               _model=plain.engine.model, _tokenizer=plain.tokenizer)
    items = prompts(plain)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tdir = target_dir(gguf, tmp / "target")
        hdir = float_head(head, plain.engine.model.cfg, tmp / "head")
        hgguf = tmp / "head.gguf"
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(hdir), "--target-model-dir",
                        str(tdir), "--outfile", str(hgguf), "--outtype", "bf16"], check=True,
                       stdout=subprocess.DEVNULL)
        eagle3 = ["--spec-type", "draft-eagle3", "-md", str(hgguf), "--spec-draft-n-max", str(a.n_max),
                  "--spec-draft-n-min", str(a.n_max), "--spec-draft-p-min", "0"]
        servers = theirs(bin_dir, str(gguf), "", ["eagle3"], a.threads, {"eagle3": eagle3})
        rows = []
        try:
            url = servers["eagle3"][1]
            params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
            for pid, kind, ids in items:
                body = dict(n_predict=a.max_tokens, temperature=0, top_k=1, ignore_eos=True, cache_prompt=False,
                            return_tokens=True, prompt=ids)
                try:
                    r = _post(url + "/completion", body)
                except OSError:
                    srv = servers["eagle3"][0]
                    srv.wait(30)
                    why = [x for x in srv.stderr.read().splitlines() if "GGML_ASSERT" in x or "error" in x.lower()]
                    sys.exit(f"llama-server died on the first request: {why[-1] if why else 'no message'}")
                t = r["timings"]
                o = ours.generate(ids, params)[0]
                s = o.stats["spec"]
                rows.append(dict(prompt=pid, kind=kind, ours_drafted=s["draft_tokens"], ours_accepted=s["accepted_tokens"],
                                 theirs_drafted=t.get("draft_n", 0), theirs_accepted=t.get("draft_n_accepted", 0),
                                 same_text=r.get("tokens") == o.token_ids))
                print(f"{pid:28s} ours {s['accepted_tokens']:4d}/{s['draft_tokens']:4d}  "
                      f"llama.cpp {rows[-1]['theirs_accepted']:4d}/{rows[-1]['theirs_drafted']:4d}  "
                      f"same text: {rows[-1]['same_text']}", flush=True)
        finally:
            _stop(servers)

    def rate(who):
        return sum(r[f"{who}_accepted"] for r in rows) / max(1, sum(r[f"{who}_drafted"] for r in rows))

    print(f"acceptance rate (accepted / drafted): ours {rate('ours'):.3f}, llama.cpp {rate('theirs'):.3f}; "
          f"same greedy text on {sum(r['same_text'] for r in rows)}/{len(rows)} prompts")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"rows": rows, "ours": rate("ours"), "theirs": rate("theirs")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
