"""Quality figures of a set of SIDs: codebook use and entropy per level, collisions, quantisation error."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def level_usage(codes: np.ndarray, k: int) -> dict[str, Any]:
    """Use of one level's ``k`` codes by the items' ``codes`` (1-D)."""
    counts = np.bincount(codes, minlength=k)
    used = counts[counts > 0]
    p = used / used.sum() if used.size else used
    entropy = float(-(p * np.log2(p)).sum()) if used.size else 0.0
    return {
        "codes": int(k),
        "used": int(used.size),
        "usage": round(used.size / k, 6),
        "entropy_bits": round(entropy, 6),
        "normalized_entropy": round(entropy / math.log2(k), 6) if k > 1 else 1.0,
        "perplexity": round(2.0**entropy, 3),
        "min_items": int(used.min()) if used.size else 0,
        "max_items": int(counts.max()) if counts.size else 0,
    }


def format_quality(quality: dict[str, Any]) -> str:
    """A plain-text table of the figures :func:`~peft_grounded.sids.build.build_sids` stores."""
    lines = ["level  codes  used   usage  entropy(bits)  norm.entropy  max items/code"]
    for lv in quality["levels"]:
        tag = f"{lv['level']}{'*' if lv.get('disambiguation') else ''}"
        lines.append(
            f"{tag:<6} {lv['codes']:>5} {lv['used']:>5} {lv['usage']:>7.1%} {lv['entropy_bits']:>14.3f} "
            f"{lv['normalized_entropy']:>13.3f} {lv['max_items']:>15}"
        )
    before, after = quality["collisions_before"], quality["collisions_after"]
    lines += [
        f"items: {quality['n_items']}; unique SIDs before handling: {before['unique_sids']} "
        f"(collision rate {before['collision_rate']:.2%}, at most {before['max_items_per_sid']} items on one SID)",
        f"after handling ({quality['dedup']}): {after['unique_sids']} unique "
        f"(collision rate {after['collision_rate']:.2%})",
        f"quantisation error: mse {quality['mse']:.5f}, relative {quality['relative_error']:.2%} "
        f"(per level: {', '.join(f'{e:.2%}' for e in quality['relative_error_per_level'])})",
    ]
    if any(lv.get("disambiguation") for lv in quality["levels"]):
        lines.append("* disambiguation level")
    return "\n".join(lines)
