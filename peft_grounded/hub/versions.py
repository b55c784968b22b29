"""The SID index next to an adapter must be the version the adapter was trained or grown on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .repo import GroundedHubError

if TYPE_CHECKING:
    from ..sids.index import SIDIndex


def check_index_version(recorded: str | None, index: SIDIndex, where: str) -> None:
    """Raise :class:`GroundedHubError` unless ``index`` is the version (fingerprint ``recorded``, from the
    adapter's SID record) the adapter was trained or grown on."""
    actual = index.fingerprint()
    if recorded is None or recorded == actual:
        return
    if recorded in index.lineage:
        why = (
            f"the adapter belongs to a parent version ({recorded}) of this index ({actual}, {index.n_items} "
            "items): grow the adapter onto it (peft_grounded.growth.grow_adapter) or use the parent index"
        )
    elif index.parent is not None or index.lineage:
        why = (
            f"the adapter belongs to index version {recorded}, not to this one ({actual}, grown from "
            f"{index.parent}): push the index the adapter was grown onto"
        )
    else:
        why = (
            f"the adapter belongs to SID index {recorded}, this index is {actual}: another build, or a parent "
            "version (an adapter grown with grow_adapter belongs to the grown index: push that one)"
        )
    raise GroundedHubError(f"The SID index of the {where} does not match its adapter: {why}.")
