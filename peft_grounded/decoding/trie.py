"""The SID constraint: a prefix trie over the catalogue's SID token ids, and the conversion of items' SIDs to
those token ids (:func:`sid_token_ids`).

A prefix trie over the Semantic-ID token-id sequences of a catalogue, stored as flat tensors.

Every node is one valid SID prefix (the root is the empty prefix); an edge is one SID token. The
edges are kept sorted by ``parent * key_base + token``, so that

- a child is found with one ``torch.searchsorted`` for a whole batch of beams, and
- the children of a node are one contiguous slice (``node_start``, ``node_degree``),

which lets :meth:`SIDTrie.allowed_mask` build the next-token mask of every beam without a Python loop.

The SID set must map 1:1 to items: no two items may share a SID, and no SID may be a proper prefix of
another (otherwise a decoded sequence could stop at, or run past, an item). When all SIDs have the same
length ``L`` a decoded sequence is complete after exactly ``L`` tokens. Variable lengths (e.g. a
disambiguation level only some items have) are supported when the set is prefix-free and an
``end_token_id`` is given: a complete SID then allows only that token.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any

import torch

DEAD = -1
"""Node id of a beam whose tokens left the trie (only possible for beams with score ``-inf``)."""


class SIDTrie:
    """Prefix trie of the SID token-id sequences of ``item_sids`` (item id -> token ids)."""

    def __init__(self, item_sids: Mapping[Hashable, Sequence[int]], end_token_id: int | None = None) -> None:
        if not isinstance(item_sids, Mapping) or len(item_sids) == 0:
            raise ValueError("item_sids must be a non-empty mapping item id -> SID token ids")
        self.items: list[Hashable] = list(item_sids)
        self._index = {item: i for i, item in enumerate(self.items)}
        sids = [_as_token_tuple(item, item_sids[item]) for item in self.items]
        self._item_of: dict[tuple[int, ...], Hashable] = {}
        for item, sid in zip(self.items, sids, strict=True):
            other = self._item_of.setdefault(sid, item)
            if other != item:
                raise ValueError(
                    f"items {other!r} and {item!r} share the SID {list(sid)}: decoding cannot tell them "
                    "apart; resolve SID collisions (e.g. add a disambiguation level) before decoding"
                )
        self.lengths = sorted({len(sid) for sid in sids})
        self.max_length = self.lengths[-1]
        self.fixed_length = len(self.lengths) == 1
        sid_tokens = {token for sid in sids for token in sid}
        if end_token_id is not None and end_token_id in sid_tokens:
            raise ValueError(f"end_token_id {end_token_id} is also a SID token; pass the model's EOS token")
        if not self.fixed_length and end_token_id is None:
            raise ValueError(
                f"SIDs have different lengths {self.lengths}: pass end_token_id (e.g. tokenizer.eos_token_id) "
                "so that a shorter SID can end, or give every item the same number of levels"
            )
        self.end_token_id = end_token_id
        self.sid_tokens = sorted(sid_tokens)

        # Nodes: one per distinct prefix, numbered in sorted order (root = 0).
        node_of: dict[tuple[int, ...], int] = {(): 0}
        edges: list[tuple[int, int, int]] = []  # (parent, token, child)
        for sid in sorted(sids):
            for depth in range(1, len(sid) + 1):
                prefix = sid[:depth]
                if prefix not in node_of:
                    node_of[prefix] = len(node_of)
                    edges.append((node_of[sid[: depth - 1]], sid[depth - 1], node_of[prefix]))
        n_nodes = len(node_of)
        node_item = torch.full((n_nodes,), -1, dtype=torch.long)
        for index, sid in enumerate(sids):
            node_item[node_of[sid]] = index
        self._check_prefix_free(edges, node_item)

        self.key_base = max(sid_tokens) + 1
        edges.sort(key=lambda e: (e[0], e[1]))
        parent = torch.tensor([e[0] for e in edges], dtype=torch.long)
        token = torch.tensor([e[1] for e in edges], dtype=torch.long)
        child = torch.tensor([e[2] for e in edges], dtype=torch.long)
        degree = torch.bincount(parent, minlength=n_nodes)
        self._cpu = {
            "keys": parent * self.key_base + token,
            "token": token,
            "child": child,
            "start": torch.cumsum(degree, 0) - degree,
            "degree": degree,
            "item": node_item,
        }
        self._by_device: dict[torch.device, dict[str, torch.Tensor]] = {torch.device("cpu"): self._cpu}

    # -- lookups ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, item: object) -> bool:
        return item in self._index

    @property
    def num_nodes(self) -> int:
        return int(self._cpu["degree"].numel())

    def item_of(self, tokens: Sequence[int]) -> Hashable | None:
        """The item whose SID is exactly ``tokens``, or ``None``."""
        return self._item_of.get(tuple(int(t) for t in tokens))

    def allowed_tokens(self, prefix: Sequence[int]) -> list[int]:
        """The tokens that may follow ``prefix`` (for inspection and tests; decoding uses the tensors)."""
        node = int(self.walk(torch.tensor([list(prefix)], dtype=torch.long))[0])
        if node == DEAD:
            return []
        t = self._cpu
        if int(t["item"][node]) >= 0:
            return [] if self.end_token_id is None else [self.end_token_id]
        start, degree = int(t["start"][node]), int(t["degree"][node])
        return t["token"][start : start + degree].tolist()

    # -- batched operations used during generation ------------------------------------------------

    def tensors(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The trie's tensors on ``device`` (copied once, then cached)."""
        device = torch.device(device)
        if device not in self._by_device:
            self._by_device[device] = {k: v.to(device) for k, v in self._cpu.items()}
        return self._by_device[device]

    def walk(self, generated: torch.Tensor) -> torch.Tensor:
        """Node id reached by each row of ``generated`` (rows x steps token ids), or ``DEAD``."""
        t = self.tensors(generated.device)
        nodes = torch.zeros(generated.shape[0], dtype=torch.long, device=generated.device)
        for step in range(generated.shape[1]):
            tokens = generated[:, step]
            keys = nodes * self.key_base + tokens
            valid = (nodes >= 0) & (tokens >= 0) & (tokens < self.key_base)
            index = torch.searchsorted(t["keys"], keys).clamp(max=t["keys"].numel() - 1)
            found = valid & (t["keys"][index] == keys)
            nodes = torch.where(found, t["child"][index], torch.full_like(nodes, DEAD))
        return nodes

    def allowed_pairs(self, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(row, token)`` index pairs of the SID tokens that extend each row's node.

        Complete SIDs and ``DEAD`` rows get none (the caller handles the end token).
        """
        rows, tokens, _ = self.allowed_edges(nodes)
        return rows, tokens

    def open_nodes(
        self, excluded: Sequence[Collection[Hashable]], device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """``[len(excluded), num_nodes]``: whether each node still leads to an item its row does not exclude
        (items not in the trie are ignored), so that a search can skip the branches it would only throw away."""
        t = self.tensors(torch.device(device))
        if "paths" not in t:
            self._add_paths()
            t = self.tensors(torch.device(device))
        rows = [[self._index[i] for i in set(items) if i in self._index] for items in excluded]
        counts = torch.zeros(len(rows), self.num_nodes, dtype=torch.long, device=t["under"].device)
        flat = [(r, i) for r, items in enumerate(rows) for i in items]
        if flat:
            row_ids = torch.tensor([r for r, _ in flat], device=counts.device)
            paths = t["paths"][torch.tensor([i for _, i in flat], device=counts.device)]  # [n, depth]
            keep = paths >= 0
            counts.index_put_(
                (row_ids[:, None].expand_as(paths)[keep], paths[keep]),
                torch.ones(int(keep.sum()), dtype=torch.long, device=counts.device),
                accumulate=True,
            )
        counts[:, 0] = torch.tensor([len(items) for items in rows], dtype=torch.long, device=counts.device)
        return counts < t["under"]

    def _add_paths(self) -> None:
        """Per item the nodes its SID passes (root excluded, ``-1`` padded), and per node its items."""
        t = self._cpu
        inverse = {item: sid for sid, item in self._item_of.items()}
        sids = torch.full((len(self.items), self.max_length), -1, dtype=torch.long)
        for index, item in enumerate(self.items):
            sids[index, : len(inverse[item])] = torch.tensor(inverse[item], dtype=torch.long)
        paths = torch.stack([self.walk(sids[:, : level + 1]) for level in range(self.max_length)], dim=1)
        paths = torch.where(paths >= 0, paths, -1)
        under = torch.zeros(self.num_nodes, dtype=torch.long)
        valid = paths >= 0
        under.index_put_((paths[valid],), torch.ones(int(valid.sum()), dtype=torch.long), accumulate=True)
        under[0] = len(self.items)
        t["paths"], t["under"] = paths, under
        self._by_device = {torch.device("cpu"): t}

    def allowed_edges(self, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(row, token, child node)`` of every SID token that extends each row's node (see
        :meth:`allowed_pairs`)."""
        t = self.tensors(nodes.device)
        live = nodes >= 0
        safe = nodes.clamp(min=0)
        degree = torch.where(live, t["degree"][safe], 0)
        start = torch.where(live, t["start"][safe], 0)
        total = int(degree.sum())
        rows = torch.arange(nodes.shape[0], device=nodes.device)
        row_index = torch.repeat_interleave(rows, degree, output_size=total)
        first = torch.repeat_interleave(start - (torch.cumsum(degree, 0) - degree), degree, output_size=total)
        edge_index = first + torch.arange(total, device=nodes.device)
        return row_index, t["token"][edge_index], t["child"][edge_index]

    def allowed_mask(self, nodes: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Boolean ``(rows, vocab_size)`` mask of :meth:`allowed_pairs`."""
        self.check_vocab_size(vocab_size)
        mask = torch.zeros(nodes.shape[0], vocab_size, dtype=torch.bool, device=nodes.device)
        mask[self.allowed_pairs(nodes)] = True
        return mask

    def check_vocab_size(self, vocab_size: int) -> None:
        """Fail clearly when a SID (or end) token has no row in a ``vocab_size``-wide output."""
        largest = max(self.key_base - 1, -1 if self.end_token_id is None else self.end_token_id)
        if largest >= vocab_size:
            raise ValueError(
                f"token id {largest} (a SID or end token) is outside the model's {vocab_size} output rows: "
                "resize the model's embeddings after adding the SID tokens"
            )

    def is_complete(self, nodes: torch.Tensor) -> torch.Tensor:
        """Whether each node is a complete SID (``DEAD`` rows: False)."""
        t = self.tensors(nodes.device)
        return (nodes >= 0) & (t["item"][nodes.clamp(min=0)] >= 0)

    # -- validation ------------------------------------------------------------------------------

    def _check_prefix_free(self, edges: list[tuple[int, int, int]], node_item: torch.Tensor) -> None:
        has_child = torch.zeros_like(node_item, dtype=torch.bool)
        if edges:
            has_child[torch.tensor([e[0] for e in edges])] = True
        inner_items = ((node_item >= 0) & has_child).nonzero().flatten().tolist()
        if inner_items:
            examples = ", ".join(repr(self.items[int(node_item[n])]) for n in inner_items[:5])
            raise ValueError(
                f"{len(inner_items)} SIDs are proper prefixes of other SIDs (items {examples}): a decoded "
                "sequence could not be mapped to one item; give every item the same number of levels "
                "(e.g. pad the disambiguation level with code 0 for all items)"
            )


def _as_token_tuple(item: Hashable, sid: Sequence[int]) -> tuple[int, ...]:
    if isinstance(sid, (str, bytes)):
        raise TypeError(
            f"item {item!r}: SID must be a sequence of token ids, got the string {sid!r}; "
            "convert it with peft_grounded.decoding.sid_token_ids(tokenizer, ...)"
        )
    try:
        tokens = tuple(int(t) for t in sid)
    except (TypeError, ValueError) as err:
        raise TypeError(f"item {item!r}: SID must be a sequence of int token ids, got {sid!r}") from err
    if not tokens:
        raise ValueError(f"item {item!r} has an empty SID")
    if min(tokens) < 0:
        raise ValueError(f"item {item!r}: negative token id in SID {list(tokens)}")
    return tokens


def check_targets(targets: Sequence[Sequence[int]], trie: SIDTrie, prompts: int) -> None:
    """Refuse targets that are not one complete SID of ``trie`` per prompt (scoring needs catalogue items)."""
    if len(targets) != prompts:
        raise ValueError(f"{len(targets)} targets for {prompts} prompts: give one target per prompt")
    for i, target in enumerate(targets):
        if trie.item_of(target) is None:
            raise ValueError(
                f"target {i} ({list(target)}) is not a SID of the trie: score only catalogue items"
            )


# Convert items' SIDs (text or token strings) to the token-id sequences decoding works on.


def sid_token_ids(
    tokenizer: Any, item_sids: Mapping[Hashable, str | Sequence[str]]
) -> dict[Hashable, list[int]]:
    """Item id -> SID token ids, checking that every SID token is one token added to ``tokenizer``.

    A SID is given as its text (``"<a_12><b_3><c_200>"``) or as its list of token strings. Fails when a SID
    would be split into ordinary sub-word pieces, i.e. when its tokens were not added to the tokenizer.
    """
    added = tokenizer.get_added_vocab()
    result: dict[Hashable, list[int]] = {}
    for item, sid in item_sids.items():
        if isinstance(sid, str):
            ids = tokenizer(sid, add_special_tokens=False)["input_ids"]
            pieces = tokenizer.convert_ids_to_tokens(ids)
            if "".join(pieces) != sid:
                raise ValueError(
                    f"item {item!r}: SID {sid!r} tokenises as {pieces}, not as SID tokens; "
                    "add the SID tokens to the tokenizer (and resize the model) first"
                )
        else:
            pieces = list(sid)
            ids = [added.get(piece, -1) for piece in pieces]
        missing = [piece for piece, i in zip(pieces, ids, strict=True) if added.get(piece) != i]
        if not ids or missing:
            raise ValueError(
                f"item {item!r}: SID tokens {missing or pieces} are not in the tokenizer's added vocabulary; "
                "add the SID tokens to the tokenizer (and resize the model) first"
            )
        result[item] = list(ids)
    return result


def item_token_ids(tokenizer: Any, index: Any) -> dict[str, list[int]]:
    """Item id -> the token ids of its SID, for the constrained decoding."""
    return sid_token_ids(tokenizer, {item: index.sid_text(item) for item in index.item_ids})
