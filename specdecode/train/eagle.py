"""Training an EAGLE head against a frozen target, with EAGLE-3's training-time test (TTT).

Data: windows of tokens x_0..x_{T-1} with the target's features per position (data.extract_shard).
Entry t of step 1 pairs the target's features at t with x_{t+1}; it is trained towards the target's
distribution at t+1 (the distribution of x_{t+2}). Step s (s = 0 .. ttt_steps-1) feeds, for every
origin t, the head's own output of step s-1 with the true token x_{t+s+1}, at position t+s, and is
trained towards the target's distribution at t+s+1: exactly what a chain draft from t computes,
because its attention sees the origin's step-1 causal prefix plus its own entries of steps 2..s
(mask [tril | I | ... | I]). Labels are soft: the target's distribution over the draft vocabulary
(its LM head rows for those ids), so the loss is the cross-entropy to it (= KL + const); step s is
weighted decay**s. Held-out metric: top-1 agreement with the target's full-vocabulary argmax."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from ..models.eagle import EagleConfig, EagleHead, default_aux_layers, init_head
from ..runtime.attention import backend
from ..runtime.device import fast_bf16


@dataclass(frozen=True)
class TrainConfig:
    kind: str = "eagle3"  # eagle3 | eagle
    draft_vocab: int = 8192  # EAGLE-3 reduced vocabulary (most frequent target tokens)
    ttt_steps: int = 3
    decay: float = 0.8  # loss weight of TTT step s is decay**s
    bf16: bool | None = None  # autocast matmuls to bfloat16 (weights and optimizer stay float32); None: where native
    steps: int = 1000  # optimizer steps
    batch_size: int = 4  # windows per step
    lr: float = 1e-3
    warmup: int = 30
    eval_every: int = 100
    save_every: int = 100
    seed: int = 0


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] long
    feats: torch.Tensor  # [B, T, F]
    final: torch.Tensor  # [B, T, H] the target's final normed hidden
    argmax: torch.Tensor  # [B, T] the target's greedy token after each position
    valid: torch.Tensor  # [B, T] bool, False on padding


class Windows:
    """Token windows and their target features, read from shards; ``batch(idx)`` pads.

    Shards stay as they were loaded (memory-mapped by load_shards), so a feature cache larger than
    memory trains: a batch copies just its own windows. Window i is rows [start, start + len) of
    shard shard_of[i]."""

    def __init__(self, shards: list[dict], eagle1: bool):
        self.key = "final" if eagle1 else "feats"
        self.shards = shards
        self.lens, self.starts, self.shard_of = [], [], []
        for k, s in enumerate(shards):
            lens = s["lens"].tolist()
            self.lens += lens
            self.starts += (torch.cumsum(s["lens"], 0) - s["lens"]).tolist()
            self.shard_of += [k] * len(lens)

    def __len__(self) -> int:
        return len(self.lens)

    def column(self, name: str) -> torch.Tensor:
        """One per-token field of every window, concatenated (ids, argmax: small)."""
        return torch.cat([s[name].long() for s in self.shards]) if self.shards else torch.zeros(0, dtype=torch.long)

    def batch(self, idx: list[int], dtype: torch.dtype, device) -> Batch:
        T = max(self.lens[i] for i in idx)
        B = len(idx)
        width = self.shards[0][self.key].shape[1]
        out = Batch(torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, width),
                    torch.zeros(B, T, self.shards[0]["final"].shape[1]), torch.zeros(B, T, dtype=torch.long),
                    torch.zeros(B, T, dtype=torch.bool))
        for b, i in enumerate(idx):
            sh, s, n = self.shards[self.shard_of[i]], self.starts[i], self.lens[i]
            out.ids[b, :n], out.argmax[b, :n], out.valid[b, :n] = sh["ids"][s:s + n], sh["argmax"][s:s + n], True
            out.feats[b, :n], out.final[b, :n] = sh[self.key][s:s + n].float(), sh["final"][s:s + n].float()
        return Batch(out.ids.to(device), out.feats.to(device, dtype), out.final.to(device, dtype),
                     out.argmax.to(device), out.valid.to(device))


def draft_vocabulary(windows: Windows, size: int, always: list[int], vocab: int) -> torch.Tensor:
    """The ``size`` most frequent target tokens (what the target emits, and the corpus), sorted ids."""
    counts = torch.bincount(windows.column("argmax"), minlength=vocab) + torch.bincount(windows.column("ids"), minlength=vocab)
    counts[torch.tensor(always, dtype=torch.long)] = counts.max() + 1
    return counts.topk(min(size, vocab)).indices.sort().values


def new_head(target, kind: str, draft_ids: torch.Tensor | None, seed: int, verifier: str = "",
             intermediate_size: int = 0) -> EagleHead:
    """A head shaped like one target layer (its MLP ``intermediate_size`` wide when given: a narrower
    head is cheaper to run, train and ship). EAGLE-3: lm_head starts from the target's LM head rows
    of the draft vocabulary and ``norm`` from its final norm (a head that reads the target's state
    well starts near the target's own predictions)."""
    c = target.cfg
    vd = len(draft_ids) if kind == "eagle3" else c.vocab_size
    cfg = EagleConfig(kind=kind, hidden_size=c.hidden_size, intermediate_size=intermediate_size or c.intermediate_size,
                      num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                      vocab_size=c.vocab_size, draft_vocab_size=vd, target_hidden_size=c.hidden_size,
                      aux_layers=default_aux_layers(c.num_layers) if kind == "eagle3" else (),
                      rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
                      max_position_embeddings=c.max_position_embeddings, verifier=verifier)
    head = init_head(cfg, seed).to(target.dtype)
    if kind == "eagle3":
        with torch.no_grad():
            head.lm_head.weight.copy_(target.head_rows(draft_ids))
            head.norm.weight.copy_(target.norm.weight)
            head.d2t.copy_(draft_ids - torch.arange(vd))
            head.t2d.zero_()
            head.t2d[draft_ids] = True
    return head.bind(target)


def ttt_loss(head: EagleHead, w_labels: torch.Tensor, batch: Batch, steps: int, decay: float):
    """Training-time test over a batch. w_labels [V_draft, H]: the target's LM head rows of the draft
    vocabulary. Returns (weighted loss, per-step top-1 agreement with the target's argmax,
    per-step valid counts)."""
    B, T = batch.ids.shape
    T1 = T - 1  # origins 0 .. T-2 (an origin needs the next token)
    pos = torch.arange(T1, device=batch.ids.device)
    with torch.no_grad():  # the label of step s at origin t is the target's row t+s+1: one matmul serves all steps
        labels = torch.softmax((batch.final[:, 1:] @ w_labels.T).float(), -1)  # [B, T1, Vd], row r = position r+1
    hidden = head.project(batch.feats[:, :T1])  # [B, T1, H]
    keys, values, total, agree, counts = [], [], 0.0, [], []
    causal = torch.ones(T1, T1, dtype=torch.bool, device=pos.device).tril()
    eye = torch.eye(T1, dtype=torch.bool, device=pos.device)
    for s in range(steps):
        idx = (pos + s + 1).clamp(max=T - 1)  # token fed = the label's position: t + s + 1
        ok = (pos + s + 1 <= T - 1)[None] & batch.valid[:, idx]  # [B, T1]
        q, k, v, res = head.qkv(head.embed(batch.ids[:, idx]), hidden, (pos + s)[None].expand(B, T1))
        keys.append(k)
        values.append(v)
        mask = torch.cat([causal] + [eye] * s, dim=1)[None, None]  # [1, 1, T1, (s+1)*T1]
        x = head.finish(backend().attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask), res)
        logp = torch.log_softmax(head.logits(x), -1)  # [B, T1, Vd]
        n = ok.sum()
        loss = -(labels[:, idx - 1] * logp).sum(-1)[ok].sum() / n.clamp_min(1)
        total = total + decay ** s * loss
        with torch.no_grad():
            hit = head.to_target(logp.argmax(-1)) == batch.argmax[:, idx]
            agree.append(float(hit[ok].float().sum()))
            counts.append(int(n))
        hidden = x
    return total, agree, counts


def _autocast(cfg: TrainConfig, device):
    # RMSNorm keeps float32 weights under autocast (torch warns that it cannot fuse; harmless)
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
    on = fast_bf16(device) if cfg.bf16 is None else cfg.bf16
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=on)


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def batch_order(n: int, step: int, batch_size: int, seed: int) -> list[int]:
    """Window indices of a step: a fresh seeded permutation per epoch, so a resumed run sees the same batches."""
    per_epoch = max(1, n // batch_size)
    epoch, k = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000003 + epoch))
    return perm[k * batch_size:(k + 1) * batch_size].tolist()


@torch.no_grad()
def evaluate(head: EagleHead, w_labels, data: Windows, cfg: TrainConfig, device) -> dict:
    """Held-out loss and per-step top-1 agreement (step 1 ≈ the acceptance rate of the first draft)."""
    head.eval()
    tot, agree, counts, nb = 0.0, [0.0] * cfg.ttt_steps, [0] * cfg.ttt_steps, 0
    for i in range(0, len(data), cfg.batch_size):
        b = data.batch(list(range(i, min(i + cfg.batch_size, len(data)))), head.dtype, device)
        with _autocast(cfg, device):
            loss, a, c = ttt_loss(head, w_labels, b, cfg.ttt_steps, cfg.decay)
        tot, nb = tot + float(loss), nb + 1
        agree = [x + y for x, y in zip(agree, a)]
        counts = [x + y for x, y in zip(counts, c)]
    head.train()
    return {"loss": tot / max(nb, 1), "top1": [a / max(c, 1) for a, c in zip(agree, counts)]}


def fit(head: EagleHead, w_labels: torch.Tensor, train: Windows, held: Windows, cfg: TrainConfig, out, device,
        deadline: float | None = None, progress: bool = True) -> dict:
    """The optimisation loop: AdamW, warmup + cosine, gradient clipping; checkpoints to
    ``out/checkpoint.pt`` every ``save_every`` steps and at a deadline, and resumes from it."""
    import time
    from pathlib import Path

    from tqdm import tqdm

    ck = Path(out) / "checkpoint.pt"
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, ev = 0, None
    if ck.exists():
        state = torch.load(ck, weights_only=True, map_location=device)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step, ev = state["step"], state.get("eval")

    def save():
        tmp = ck.with_suffix(".tmp")
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "eval": ev}, tmp)
        tmp.replace(ck)

    head.train()
    bar = tqdm(total=cfg.steps, initial=step, desc="train-head", unit="step", disable=not progress)
    while step < cfg.steps:
        if deadline is not None and time.time() > deadline:
            save()
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        b = train.batch(batch_order(len(train), step, cfg.batch_size, cfg.seed), head.dtype, device)
        with _autocast(cfg, device):
            loss, agree, counts = ttt_loss(head, w_labels, b, cfg.ttt_steps, cfg.decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        post = {"loss": f"{loss.detach().item():.3f}", "top1": f"{agree[0] / max(counts[0], 1):.2f}"}
        if ev is not None:
            post["eval_top1"] = f"{ev['top1'][0]:.3f}"
        bar.set_postfix(post)
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            ev = evaluate(head, w_labels, held, cfg, device) if len(held) else None
            if ev is not None:
                bar.write(f"step {step}: eval loss {ev['loss']:.3f}, top-1 agreement per step "
                          + " ".join(f"{a:.3f}" for a in ev["top1"]))
        if step % cfg.save_every == 0 or step == cfg.steps:
            save()
    bar.close()
    head.eval()
    return {"step": step, "done": step >= cfg.steps, "eval": ev}
