"""Speculative-decoding metrics with the definitions vLLM and llama.cpp share.

steps = verify forwards of the target; acceptance_rate = accepted / drafted;
mean_acceptance_length τ = 1 + accepted / steps (tokens produced per target forward);
accepted_per_position[i] = drafts whose position i+1 was accepted."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    type: str = "none"
    steps: int = 0
    draft_steps: int = 0  # steps that verified at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    # per drafter ("none" = steps that drafted nothing): steps, draft_tokens, accepted_tokens, draft_time_s
    by_drafter: dict[str, dict] = field(default_factory=dict)

    def record(self, drafted: int, accepted: int, draft_time: float, verify_time: float, drafter: str = "") -> None:
        """One verify step that checked ``drafted`` draft tokens (for a tree: its depth) and kept
        ``accepted``; ``drafter``: the proposer that drafted them."""
        d = self.by_drafter.setdefault(drafter if drafted else "none", {"steps": 0, "draft_tokens": 0,
                                                                          "accepted_tokens": 0, "draft_time_s": 0.0})
        d["steps"] += 1
        d["draft_tokens"] += drafted
        d["accepted_tokens"] += accepted
        d["draft_time_s"] += draft_time
        self.steps += 1
        self.draft_steps += drafted > 0
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.draft_time_s += draft_time
        self.verify_time_s += verify_time
        for lst, n in ((self.drafted_per_position, drafted), (self.accepted_per_position, accepted)):
            if len(lst) < n:
                lst.extend([0] * (n - len(lst)))
            for i in range(n):
                lst[i] += 1

    def merge(self, other: "SpecStats") -> None:
        self.steps += other.steps
        self.draft_steps += other.draft_steps
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        self.draft_time_s += other.draft_time_s
        self.verify_time_s += other.verify_time_s
        for mine, theirs in ((self.drafted_per_position, other.drafted_per_position),
                             (self.accepted_per_position, other.accepted_per_position)):
            if len(mine) < len(theirs):
                mine.extend([0] * (len(theirs) - len(mine)))
            for i, n in enumerate(theirs):
                mine[i] += n

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.steps if self.steps else 1.0

    def to_dict(self) -> dict:
        return {
            "type": self.type, "steps": self.steps, "draft_steps": self.draft_steps,
            "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "accepted_per_position": list(self.accepted_per_position),
            "drafted_per_position": list(self.drafted_per_position),
            "draft_time_s": round(self.draft_time_s, 4), "verify_time_s": round(self.verify_time_s, 4),
            "by_drafter": {k: {**v, "draft_time_s": round(v["draft_time_s"], 4),
                               "acceptance_rate": round(v["accepted_tokens"] / v["draft_tokens"], 4)
                               if v["draft_tokens"] else 0.0} for k, v in self.by_drafter.items()},
        }
