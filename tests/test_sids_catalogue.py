"""The catalogue representation: leave-one-out split, training targets, cold items, k-core, text template."""

from __future__ import annotations

import pytest

from peft_grounded.sids.catalogue import Catalogue, CatalogueError, Item, LeaveOneOut, TextTemplate


def _catalogue(sequences):
    ids = sorted({i for seq in sequences.values() for i in seq})
    items = {i: Item(i, title=f"item {i}", categories=("Top", f"Sub{i}")) for i in ids}
    return Catalogue("toy", items, {u: tuple(s) for u, s in sequences.items()})


def test_leave_one_out_split_and_examples():
    cat = _catalogue({"u1": "abcde", "u2": "bcd", "u3": "ab"})
    split = cat.leave_one_out()
    assert split.skipped_short_users == 1  # u3 has 2 interactions: counted, skipped
    u1 = split.users[0]
    assert (u1.history, u1.valid, u1.test) == (("a", "b", "c"), "d", "e")
    assert list(split.train_examples()) == [("u1", ("a",), "b"), ("u1", ("a", "b"), "c")]
    assert list(split.valid_examples()) == [("u1", ("a", "b", "c"), "d"), ("u2", ("b",), "c")]
    assert list(split.test_examples(max_history=2)) == [("u1", ("c", "d"), "e"), ("u2", ("b", "c"), "d")]
    assert list(split.train_examples(max_history=1)) == [("u1", ("a",), "b"), ("u1", ("b",), "c")]


def test_training_target_counts_and_cold_items():
    cat = _catalogue({"u1": "abcxy", "u2": "abcbz", "u3": "acbqy"})
    split = cat.leave_one_out()
    counts = split.training_target_counts()
    # histories: abc, abc, acb -> targets b, c, b, c, c, b (first items are never targets)
    assert counts == {"b": 3, "c": 3}
    # targets: x, y, b, z, q, y -> b was a training target 3 times, the others never
    assert split.cold_items(max_count=0) == {"x", "y", "z", "q"}
    assert split.cold_items(max_count=3) == {"x", "y", "z", "q", "b"}


def test_short_users_only_is_a_clear_error():
    with pytest.raises(CatalogueError, match=r"no user has at least 3 interactions.*2 users skipped"):
        _catalogue({"u1": "ab", "u2": "c"}).leave_one_out()
    with pytest.raises(ValueError, match="needs >= 3"):
        LeaveOneOut.from_sequences({"u": ("a", "b", "c")}, min_length=2)


def test_to_datasets():
    split = _catalogue({"u1": "abcde", "u2": "bcd"}).leave_one_out()
    ds = split.to_datasets()
    assert ds["train"].num_rows == 2 and ds["valid"].num_rows == 2 and ds["test"].num_rows == 2
    assert ds["test"][0] == {"user_id": "u1", "history": ["a", "b", "c", "d"], "target": "e"}


def test_k_core_is_iterative():
    # k=2: item "z" (1 interaction) goes; then u3 ("y", "z" -> "y") has 1 left and goes; then "y" has 1 and goes
    cat = _catalogue({"u1": "ab", "u2": "aby", "u3": "yz"})
    core = cat.k_core(2)
    assert core.sequences == {"u1": ("a", "b"), "u2": ("a", "b")}
    assert set(core.items) == {"a", "b"}
    with pytest.raises(CatalogueError, match="empty"):
        cat.k_core(5)


def test_counts_labels_and_subset():
    cat = _catalogue({"u1": "abc", "u2": "ab"})
    assert cat.item_counts() == {"a": 2, "b": 2, "c": 1}
    assert cat.category_labels(0)["a"] == "Top"
    assert cat.category_labels(5)["a"] == "Suba"  # deeper than the path: the deepest element
    sub = cat.subset(["a", "c"])
    assert sub.sequences == {"u1": ("a", "c"), "u2": ("a",)}


def test_text_template():
    item = Item("1", title="Pen", brand="Acme", categories=("Office", "Pens"), extra={"price": "2"})
    assert TextTemplate().render(item) == "Title: Pen\nBrand: Acme\nCategories: Office > Pens"
    bare = TextTemplate(fields=("title", "price", "description"), labelled=False, separator=" | ")
    assert bare.render(item) == "Pen | 2"
    assert TextTemplate.from_spec("title, brand").fields == ("title", "brand")
    assert TextTemplate.from_spec(bare.spec()) == bare
    assert TextTemplate(max_chars=2).render(item).startswith("Title: Pe\n")
    with pytest.raises(ValueError, match="at least one field"):
        TextTemplate(fields=())
