"""The settings of an evaluation: which users, which cut-offs, how to decode (light: no torch, so that
``peft-grounded evaluate --help`` and other readers of the settings stay fast)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .metrics import DEFAULT_KS


@dataclass
class EvalSettings:
    """How many users, which cut-offs, and how to decode."""

    ks: list[int] = field(
        default_factory=lambda: list(DEFAULT_KS), metadata={"help": "Cut-offs K of Recall@K / NDCG@K."}
    )
    users: int | None = field(
        default=None,
        metadata={"help": "Evaluate a seeded sample of this many users per part (None: every user)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the user samples."})
    num_beams: int = field(default=20, metadata={"help": "Beams of the constrained beam search."})
    batch_size: int = field(default=16, metadata={"help": "Prompts decoded per batch."})
    cold_max_count: int = field(
        default=1, metadata={"help": "Cold item: a target seen at most this often as a training target."}
    )
    cold: bool = field(default=True, metadata={"help": "Also score the users whose target is a cold item."})
    bf16: bool = field(default=False, metadata={"help": "bf16 base and decoding (bf16 autocast)."})
    new_item_share: float | None = field(
        default=None,
        metadata={
            "help": "For a grown index (add-items): give up to this share of each top-K to the items it added that "
            "share a generated item's SID prefix (TIGER's cold-start rule; decoding.mix_new_items); None: off."
        },
    )
    match_levels: int | None = field(
        default=None, metadata={"help": "Prefix codes a new item must share (None: all levels but the last)."}
    )
    exclude_history: bool = field(
        default=False,
        metadata={
            "help": "Leave the user's own history items out of the ranked list, as the peers do (decodes "
            "num_beams, keeps the best max(ks) unseen items)."
        },
    )

    def __post_init__(self) -> None:
        problems = []
        for name in ("num_beams", "batch_size"):
            value = getattr(self, name)
            if not _positive_int(value):
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if self.users is not None and not _positive_int(self.users):
            problems.append(f"users must be a positive integer or None (every user), got {self.users!r}")
        if (
            not isinstance(self.cold_max_count, int)
            or isinstance(self.cold_max_count, bool)
            or self.cold_max_count < 0
        ):
            problems.append(f"cold_max_count must be an integer >= 0, got {self.cold_max_count!r}")
        if isinstance(self.ks, (str, bytes)) or not self.ks or not all(_positive_int(k) for k in self.ks):
            problems.append(f"ks must be positive integers, got {self.ks!r}")
        if self.new_item_share is not None and not (
            isinstance(self.new_item_share, (int, float)) and 0 <= self.new_item_share <= 1
        ):
            problems.append(
                f"new_item_share must be a fraction between 0 and 1 or None, got {self.new_item_share!r}"
            )
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            problems.append(f"seed must be an integer, got {self.seed!r}")
        if problems:
            raise ValueError("EvalSettings: " + "; ".join(problems))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
