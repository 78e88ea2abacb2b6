"""``train-head --kind mtp``: train an MTP head (next-next-token prediction) for a frozen target, then write
the target's GGUF with the head attached, so that ``--spec-type draft-mtp`` runs on that one file.

Data: the corpus train/data.py resolves (``data``: 'stdlib' = the standard library's source, files,
directories, globs), split by file as the EAGLE trainer splits it (``eval_frac``), concatenated and cut into
windows, a ``chat_fraction`` of them wrapped as an assistant's reply in the chat template; with ``distill``
> 0, interleaved one for one with the target's own answers to chat prompts written from those files
(train/data.py). Evaluation prompts (Spec-Bench) are never read.
Targets: the target's distribution at position i + 1 (soft cross-entropy: what verification accepts) over
the batch's candidates, the union of the target's top CANDIDATES per position (nearly all of its mass), so
the head's LM-head product costs |candidates| rows, not the vocabulary. Each target batch serves ``echo``
optimizer steps and the frozen target runs in bfloat16: its forward dominates the cost on a CPU. Held-out
agreement is over the full vocabulary. Pass s >= 2 is chained drafting (models.mtp.chained_explicit).

``args`` is any namespace (``specdecode train-head --kind mtp`` passes its own); missing attributes take
the defaults of DEFAULTS (``model`` and ``out`` are required). The state is saved to OUT/train_state.pt
every ``save_every`` steps and a rerun with the same OUT resumes from it (``fresh=True`` restarts);
``time_limit`` (minutes) stops cleanly, still writing the head. ``python -m specdecode.train.mtp --help``
lists the options."""
from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.mtp import MTPConfig, build_mtp_head, chained_explicit

DEFAULTS = dict(data=["stdlib"], eval_frac=0.05, seed=0, device="auto", dtype="auto", steps=600, time_limit=0.0,
                batch_size=4, seq_len=256, lr=1.5e-3, warmup=10, ttt_steps=2, echo=2, eval_every=40,
                save_every=20, eval_batches=4, chat_fraction=0.5, distill=0, distill_tokens=256, gguf_out="",
                fresh=False, threads=0)
CANDIDATES = 32  # target top-k per position whose union is the training softmax's support
ASKS = ("Show me the Python module {}.", "Write the code of {}.", "Continue the file {}.", "What is in {}?")


def sequences(files: list[Path], tok, seq_len: int, seed: int, chat_fraction: float = 0.5):
    """Endless stream of token lists of length seq_len, deterministic for a seed (epochs reshuffle)."""
    eos = (sorted(tok.eos_ids) or [0])[0]
    for epoch in range(1 << 30):
        rng = random.Random(f"{seed}-{epoch}")
        order = files[:]
        rng.shuffle(order)
        buf: list[int] = []
        for f in order:
            buf += tok.encode(f.read_text(errors="replace"), add_special_tokens=False) + [eos]
            while len(buf) >= seq_len:
                prefix = []
                if rng.random() < chat_fraction:
                    ask = rng.choice(ASKS).format(f.stem)
                    text = tok.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True)
                    prefix = tok.encode(text, add_special_tokens=False)[:seq_len // 2]
                body = seq_len - len(prefix)
                yield prefix + buf[:body]
                buf = buf[body:]


def distilled(model, tok, files: list[Path], n: int, max_new: int, seed: int, cache: Path) -> list[list[int]]:
    """prompt + the target's greedy answer for n chat prompts written from ``files`` (train/prompts.py's
    prompts, train/data.py's generation: the EAGLE trainer's too), cached in ``cache`` (resumable)."""
    from .data import answered
    from .prompts import distill_prompts

    return answered(model, tok, distill_prompts(files, n, seed), max_new, 8, cache)


def packed(convs: list[list[int]], seq_len: int, eos: int):
    """Endless windows of seq_len tokens over the conversations, concatenated in order (cycling)."""
    buf: list[int] = []
    while True:
        for c in convs:
            buf += c + [eos]
            while len(buf) >= seq_len:
                yield buf[:seq_len]
                buf = buf[seq_len:]


def interleave(*streams):
    while True:
        for s in streams:
            yield next(s)


def batches(stream, batch_size: int):
    while True:
        yield torch.tensor([next(stream) for _ in range(batch_size)])


def head_losses(head, target, ids: torch.Tensor, hidden: torch.Tensor, tgt_logits: torch.Tensor, passes: int,
                cand: torch.Tensor | None = None):
    """ids [B, T]; hidden [B, T, H] and tgt_logits [B, T, V] the target's final hidden states and logits.
    Position p predicts the target's distribution at p + 1 from (h_p, t_{p+1}), over the token ids ``cand``
    [C] (None: the whole vocabulary). Returns [(loss, top-1 agreement within cand)] per pass."""
    w = head.head_weight(0, target)
    w = (w if cand is None else w[cand]).float()  # [C, H]
    tl = tgt_logits[:, 1:] if cand is None else tgt_logits[:, 1:, cand]
    tgt, best = torch.softmax(tl.float(), -1), tl.argmax(-1)
    out = []
    for s, g in enumerate(chained_explicit(head, target, ids[:, 1:], hidden[:, :-1], passes), start=1):
        logits = (head.layers[0].shared_head.norm(g[:, s - 1:]) @ w.T).float()  # pass s needs s - 1 earlier positions
        ce = -(tgt[:, s - 1:] * F.log_softmax(logits, -1)).sum(-1).mean()
        out.append((ce, (logits.argmax(-1) == best[:, s - 1:]).float().mean()))
    return out


class Target:
    """The frozen target: final hidden states and distributions for a batch, through its own runner."""

    def __init__(self, model, batch_size: int, seq_len: int):
        from .data import target_runner

        self.model = model
        self.runner = target_runner(model, batch_size, seq_len)

    def __call__(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [B, T] -> (hidden [B, T, H], logits [B, T, V]), copies: inference tensors cannot join autograd."""
        logits, hidden, _ = self.runner.forward(list(range(len(ids))), ids.tolist())
        return hidden.float(), logits.clone()


def init_head(target_model, dtype, device):
    """One module initialised from the target's last block, with an eh_proj passing hnorm(h_i) through and
    the block's branches scaled down: it starts as a soft copy of the target's next-token guess (measured:
    cross-entropy ~8.6 nats against ~18-29 for inits that keep the block's full strength or the final norm)."""
    head = build_mtp_head(MTPConfig(target_model.cfg, 1), dtype, device)
    layer, last, H = head.layers[0], target_model.layers[-1], target_model.cfg.hidden_size
    with torch.no_grad():
        for name, p in last.named_parameters():
            layer.get_parameter(name).copy_(p)
        eye = torch.eye(H, dtype=dtype, device=device)
        layer.eh_proj.weight.copy_(torch.cat([torch.zeros_like(eye), eye], 1))
        # the block was tuned for the target's large deep residual stream: start its branches small
        layer.self_attn.o_proj.weight.mul_(0.1)
        layer.mlp.down_proj.weight.mul_(0.1)
    return head


def evaluate(head, target_model, held: dict[str, list[tuple]], passes: int) -> dict[str, list[float]]:
    """Held-out top-1 agreement with the target over the full vocabulary, per chained step, per slice.
    held: {slice: cached (ids [B, T], hidden [B, T, H], the target's argmax [B, T]) batches}."""
    w = head.head_weight(0, target_model).float()
    acc = {name: [0.0] * passes for name in held}
    with torch.no_grad():
        for name, batch in held.items():
            for ids, hidden, best in batch:
                passes_g = chained_explicit(head, target_model, ids[:, 1:], hidden[:, :-1], passes)
                for s, g in enumerate(passes_g, start=1):
                    pred = (head.layers[0].shared_head.norm(g[:, s - 1:]) @ w.T).argmax(-1)
                    acc[name][s - 1] += (pred == best[:, s:]).float().mean().item() / len(batch)
    return {name: [round(x, 4) for x in v] for name, v in acc.items()}


def make_data(a, model, tok, target: Target, out: Path):
    """(training batch stream, held-out {slice: cached batches}, description) for the corpus in ``a``:
    code windows, interleaved one for one with the target's own chat answers when ``distill`` > 0."""
    from .data import is_heldout, resolve_data

    files = resolve_data(a.data)
    held_files = [f for f in files if is_heldout(f, a.eval_frac)] or files[-1:]
    train = [f for f in files if f not in set(held_files)] or files
    eos = (sorted(tok.eos_ids) or [0])[0]
    stream = sequences(train, tok, a.seq_len, a.seed, a.chat_fraction)
    held_streams = {"code": batches(sequences(held_files, tok, a.seq_len, a.seed, a.chat_fraction), a.batch_size)}
    n_held = {"code": a.eval_batches}
    if a.distill:
        chat = distilled(model, tok, train, a.distill, a.distill_tokens, a.seed, out / "distill_train.json")
        chat_held = distilled(model, tok, held_files, max(1, round(a.distill * a.eval_frac)), a.distill_tokens,
                              a.seed + 1, out / "distill_eval.json")
        stream = interleave(stream, packed(chat, a.seq_len, eos))
        held_streams["chat"] = batches(packed(chat_held, a.seq_len, eos), a.batch_size)
        n_held["chat"] = max(1, sum(map(len, chat_held)) // (a.seq_len * a.batch_size))
    held = {}
    for name, hs in held_streams.items():  # the target's outputs on the held-out slices, computed once
        held[name] = []
        for _ in range(n_held[name]):
            ids = next(hs).to(target.model.device)
            hidden, logits = target(ids)
            held[name].append((ids, hidden, logits.argmax(-1)))
    desc = {"corpus": [str(d) for d in a.data], "eval_frac": a.eval_frac, "train_files": len(train),
            "heldout_files": len(held_files), "distill": a.distill, "distill_tokens": a.distill_tokens}
    return batches(stream, a.batch_size), held, desc


def train_mtp_head(args, _model=None, _tokenizer=None) -> int:
    """Trains, saves OUT (head directory: mtp.safetensors + config.json with the figures) and the GGUF with
    the head attached (``gguf_out``, default OUT/<model>-mtp.gguf, for GGUF targets). Returns 0 (exit status).
    ``_model``/``_tokenizer``: an already loaded target (tests)."""
    from tqdm import tqdm

    from ..runtime.device import fast_bf16, resolve_device_dtype
    from ..loader import load_checkpoint
    from ..loader.mtp_ckpt import attach_mtp, save_head_dir
    from ..store import resolve_model
    from .data import resolve_data

    a = argparse.Namespace(**{**DEFAULTS, **{k: v for k, v in vars(args).items() if v is not None}})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    # the frozen target runs in bfloat16 where that is native (float32 where it is emulated) unless --dtype
    # says otherwise; the head trains in float32
    device, target_dtype = resolve_device_dtype(a.device, "float32" if a.dtype == "auto" else a.dtype)
    if a.dtype == "auto" and fast_bf16(device):
        target_dtype = torch.bfloat16
    resolve_data(a.data)  # validate before the (slow) model load
    path = resolve_model(a.model)
    model, tok = (_model, _tokenizer) if _model is not None else load_checkpoint(path, target_dtype, device)
    target = Target(model, a.batch_size, a.seq_len)
    stream, held, desc = make_data(a, model, tok, target, out)

    torch.manual_seed(a.seed)
    head = init_head(model, torch.float32, device)
    params = list(head.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / a.warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(i, a.steps) / a.steps))))
    state_file, step, history = out / "train_state.pt", 0, []
    if state_file.exists() and not a.fresh:
        st = torch.load(state_file, map_location=device, weights_only=False)
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        step, history = st["step"], st["history"]
    for _ in range(-(-step // a.echo)):  # resume: the stream is deterministic; skip what was consumed
        next(stream)

    def save():
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step,
                    "history": history, "args": vars(a)}, state_file)

    t_start, tokens = time.monotonic(), 0
    bar = tqdm(total=a.steps, initial=step, desc="train mtp", unit="step")
    while step < a.steps and not (a.time_limit > 0 and (time.monotonic() - t_start) / 60 > a.time_limit):
        ids = next(stream).to(device)
        hidden, logits = target(ids)
        cand = logits[:, 1:].topk(CANDIDATES, -1).indices.unique()  # [C] token ids
        tokens += ids.numel()
        for _ in range(min(a.echo, a.steps - step)):  # one target batch, `echo` optimizer steps
            losses = head_losses(head, model, ids, hidden, logits, a.ttt_steps, cand)
            loss = sum(0.8 ** s * ce for s, (ce, _) in enumerate(losses))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            row = {"step": step, "loss": round(loss.item(), 4), "acc": [round(x.item(), 4) for _, x in losses]}
            if step % a.eval_every == 0 or step == a.steps:
                row["heldout"] = evaluate(head, model, held, a.ttt_steps)
            history.append(row)
            last = next((r["heldout"] for r in reversed(history) if "heldout" in r), {})
            bar.set_postfix(loss=row["loss"], acc=row["acc"][0], **{k: v[0] for k, v in last.items()})
            bar.update()
            if step % a.save_every == 0:
                save()
    bar.close()
    final = evaluate(head, model, held, a.ttt_steps)
    save()
    run = {"steps": step, "heldout_top1_agreement_per_step": final, "tokens_this_run": tokens,
           "minutes_this_run": round((time.monotonic() - t_start) / 60, 2), "seed": a.seed, "seq_len": a.seq_len,
           "batch_size": a.batch_size, "lr": a.lr, "ttt_steps": a.ttt_steps, "echo": a.echo, **desc}
    save_head_dir(head, out, {"base_model": a.model, "train": run})
    print(f"held-out top-1 agreement with the target per chained step: {final}; head saved to {out}")
    if step < a.steps:
        print(f"stopped at step {step}/{a.steps} (time limit): rerun the same command to resume")
    if path.suffix == ".gguf":
        gguf_out = Path(a.gguf_out or out / f"{path.stem}-mtp.gguf")
        attach_mtp(path, head, gguf_out)
        print(f"model with the MTP head: {gguf_out} (use --model {gguf_out} --spec-type draft-mtp)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdecode.train.mtp", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "-m", required=True)
    p.add_argument("--out", required=True, help="head directory to write (and resume from)")
    p.add_argument("--data", nargs="+", help="'stdlib' (default), files, directories or globs")
    for k, v in DEFAULTS.items():
        if k not in ("data", "fresh"):
            p.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    p.add_argument("--fresh", action="store_true", help="ignore a saved state in OUT")
    return train_mtp_head(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
