"""The settings of an evaluation: which users, which cut-offs, how to decode (light: no torch, so that
``peft-grounded evaluate --help`` and other readers of the settings stay fast)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    decode_batch_size: int = field(default=16, metadata={"help": "Prompts decoded per batch."})
    cold_max_count: int = field(
        default=1, metadata={"help": "Cold item: a target seen at most this often as a training target."}
    )
    cold: bool = field(default=True, metadata={"help": "Also score the users whose target is a cold item."})
    bf16: bool = field(default=False, metadata={"help": "bf16 base and decoding (bf16 autocast)."})
    exclude_history: bool = field(
        default=False,
        metadata={
            "help": "Leave the user's own history items out of the ranked list, as the peers do and recommend "
            "does (inside the beam search). A new-item rule stored with the adapter always leaves them out."
        },
    )

    def __post_init__(self) -> None:
        from .. import checks

        ks_ok = (
            not isinstance(self.ks, (str, bytes))
            and bool(self.ks)
            and all(checks.is_int(k) and k >= 1 for k in self.ks)
        )
        checks.raise_problems(
            "EvalSettings",
            [
                checks.int_at_least("num_beams", self.num_beams, 1, flag="--num-beams"),
                checks.int_at_least(
                    "decode_batch_size", self.decode_batch_size, 1, flag="--decode-batch-size"
                ),
                checks.int_at_least("users", self.users, 1, flag="--users", none_ok=True),
                checks.int_at_least("cold_max_count", self.cold_max_count, 0, flag="--cold-max-count"),
                None if ks_ok else f"ks must be positive integers, got {self.ks!r} (--ks)",
                None if checks.is_int(self.seed) else f"seed must be an integer, got {self.seed!r} (--seed)",
            ],
        )
