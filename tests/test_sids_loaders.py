"""Every catalogue loader on fixture files the tests write, and MovieLens-100K from the recbole wheel."""

from __future__ import annotations

import importlib.util
import json

import pytest
from helpers.sids_fixtures import (
    EXPECTED_SEQUENCES,
    TABLE_INTERACTION_COLUMNS,
    TABLE_ITEM_COLUMNS,
    write_amazon,
    write_lcrec,
    write_ml1m,
    write_ml100k,
    write_recbole,
    write_table,
)

from peft_grounded.sids.catalogue import CatalogueError
from peft_grounded.sids.loaders import (
    clean_text,
    detect_format,
    load_amazon,
    load_catalogue,
    load_lcrec,
    load_movielens,
    load_recbole,
    load_table,
)


def _check_toy(cat, sequences=EXPECTED_SEQUENCES):
    assert set(cat.items) == {"i1", "i2", "i3", "i4"}  # i5 has no text
    assert cat.report.items_without_text == 1
    assert cat.report.interactions_unknown_item == 1  # "ghost"
    assert cat.sequences == sequences
    assert cat.items["i1"].title == "Blue Pen"
    assert cat.items["i1"].categories == ("Office", "Pens")
    assert cat.items["i1"].brand == "Acme"


def test_clean_text():
    assert clean_text("A &amp; B <br/> c\n\n d") == "A & B c d"
    assert clean_text(["x", None, "y"]) == "x y"
    assert clean_text(None) == ""


def test_lcrec(tmp_path):
    write_lcrec(tmp_path)
    for source in (tmp_path, tmp_path / "Toy.item.json", tmp_path / "Toy"):
        cat = load_lcrec(source)
        _check_toy(cat)
        assert cat.name == "Toy"
    assert cat.items["i1"].description == "A ballpoint pen & cap"
    assert cat.items["i3"].description == "Heavy duty"
    assert detect_format(tmp_path) == "lcrec"


def test_lcrec_items_only(tmp_path):
    write_lcrec(tmp_path)
    (tmp_path / "Toy.inter.json").unlink()
    cat = load_catalogue(tmp_path)
    assert len(cat) == 4 and cat.sequences == {}


@pytest.mark.parametrize("release", [2014, 2018, 2023])
def test_amazon(tmp_path, release):
    meta, reviews = write_amazon(tmp_path, release)
    cat = load_amazon(meta, reviews)
    _check_toy(cat)
    assert cat.name == "Toy"
    assert load_catalogue(tmp_path).sequences == EXPECTED_SEQUENCES  # directory: meta_* + its reviews


def test_amazon_keeps_only_reviewed_items(tmp_path):
    meta, reviews = write_amazon(tmp_path, 2018)
    with open(meta, "a") as f:
        f.write(json.dumps({"asin": "never-reviewed", "title": "Lonely item"}) + "\n")
        f.write("{not json nor python\n")
    cat = load_amazon(meta, reviews)
    assert "never-reviewed" not in cat.items
    assert cat.report.malformed_rows == 1
    assert "never-reviewed" in load_amazon(meta, reviews, keep_items="all").items
    assert "never-reviewed" in load_amazon(meta).items  # metadata only: everything


def test_movielens_100k_raw(tmp_path):
    write_ml100k(tmp_path)
    cat = load_movielens(tmp_path)
    assert cat.items["3"].title == "Café Society (1995)"  # latin-1
    assert cat.items["1"].categories == ("Animation", "Children's", "Comedy")
    assert cat.items["2"].categories == ("Action", "Adventure", "Thriller")
    assert cat.sequences == {"7": ("1", "3", "2"), "8": ("1",)}
    assert cat.report.interactions_unknown_item == 1
    assert detect_format(tmp_path) == "movielens"


def test_movielens_1m_raw(tmp_path):
    write_ml1m(tmp_path)
    cat = load_catalogue(tmp_path)
    assert cat.items["2"].categories == ("Adventure", "Fantasy")
    assert cat.sequences == {"1": ("1", "2"), "2": ("1",)}
    assert cat.report.malformed_rows == 1


def test_movielens_csv_releases(tmp_path):
    (tmp_path / "movies.csv").write_text(
        'movieId,title,genres\n1,Toy Story (1995),Adventure|Animation\n2,"Heat, The (1995)",Action\n'
    )
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,2,4.0,20\n1,1,3.5,10\n")
    cat = load_catalogue(tmp_path)
    assert cat.items["2"].title == "Heat, The (1995)"
    assert cat.items["1"].categories == ("Adventure", "Animation")
    assert cat.sequences == {"1": ("1", "2")}


def test_csv_with_byte_order_mark(tmp_path):
    items = tmp_path / "items.csv"
    items.write_bytes("\ufeffitem_id,title\n1,Pen\n".encode())
    assert load_table(items).items["1"].title == "Pen"


def test_recbole(tmp_path):
    write_recbole(tmp_path)
    cat = load_recbole(tmp_path, "toy")
    assert cat.items["2"].title == "Heat"
    assert cat.items["2"].categories == ("Action", "Crime", "Thriller")
    assert cat.items["1"].extra == {"release_year": "1995"}
    assert cat.sequences == {"5": ("1", "2"), "6": ("1",)}
    assert cat.report.interactions_unknown_item == 1
    assert load_catalogue(tmp_path / "toy.item").sequences == cat.sequences
    with open(tmp_path / "toy.inter", "a") as f:
        f.write("6\t2\t5\tyesterday\n")  # a malformed timestamp is counted, not a crash
    cat = load_recbole(tmp_path, "toy")
    assert cat.report.malformed_rows == 1 and cat.sequences == {"5": ("1", "2"), "6": ("1",)}


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_table_with_column_mapping(tmp_path, kind):
    items, inter = write_table(tmp_path, kind)
    cat = load_table(items, inter, TABLE_ITEM_COLUMNS, TABLE_INTERACTION_COLUMNS)
    _check_toy(cat)
    assert cat.items["i1"].extra == {"price": "1.5"}


def test_table_missing_column_names_the_fix(tmp_path):
    items, inter = write_table(tmp_path, "csv")
    with pytest.raises(CatalogueError, match=r"no column \['item_id'\].*asin.*item_columns"):
        load_table(items, inter)


def test_unknown_path_and_format(tmp_path):
    with pytest.raises(CatalogueError, match="does not exist"):
        load_catalogue(tmp_path / "nope")
    (tmp_path / "README").write_text("hi")
    with pytest.raises(CatalogueError, match="cannot tell the format"):
        load_catalogue(tmp_path / "README")


def test_empty_catalogue_is_a_clear_error(tmp_path):
    (tmp_path / "E.item.json").write_text("{}")
    (tmp_path / "E.inter.json").write_text("{}")
    with pytest.raises(CatalogueError, match=r"has no items.*check the path"):
        load_lcrec(tmp_path)


def test_catalogue_of_textless_items_is_a_clear_error(tmp_path):
    (tmp_path / "E.item.json").write_text(json.dumps({"1": {"title": ""}, "2": {"title": " "}}))
    with pytest.raises(CatalogueError, match=r"no items.*2 items with no text"):
        load_lcrec(tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("recbole") is None, reason="recbole wheel not installed")
def test_movielens_100k_from_recbole_wheel():
    cat = load_catalogue("movielens-100k")
    assert len(cat) == 1682
    assert cat.n_interactions == 100_000
    assert len(cat.sequences) == 943
    assert cat.items["1"].title == "Toy Story"
    assert cat.items["1"].categories == ("Animation", "Children's", "Comedy")
    assert cat.report.interactions_unknown_item == 0
    split = cat.leave_one_out()
    assert len(split) == 943 and split.skipped_short_users == 0
    # every sequence is in time order
    import csv

    from peft_grounded import assets

    with open(assets.movielens_100k() / "ml-100k.inter") as f:
        reader = csv.reader(f, delimiter="\t")
        next(reader)
        stamps = {(u, i): float(t) for u, i, _, t in reader}
    seq = cat.sequences["196"]
    assert [stamps[("196", i)] for i in seq] == sorted(stamps[("196", i)] for i in seq)


def test_lcrec_interaction_file_names_its_pair(tmp_path):
    """``--catalogue X.inter.json`` is a natural mistake: it loads the pair, like ``X.item.json``."""
    write_lcrec(tmp_path)
    assert detect_format(tmp_path / "Toy.inter.json") == "lcrec"
    _check_toy(load_catalogue(tmp_path / "Toy.inter.json"))


def test_lcrec_interactions_that_are_not_a_mapping_are_an_error(tmp_path):
    write_lcrec(tmp_path)
    (tmp_path / "Toy.inter.json").write_text(json.dumps([["i1", "i2"], ["i3"]]))
    with pytest.raises(CatalogueError, match=r"Toy.inter.json should map user ids to lists.*got a list"):
        load_lcrec(tmp_path)
    (tmp_path / "Toy.inter.json").write_text(json.dumps({"u1": "i1", "u2": ["i2"]}))
    with pytest.raises(CatalogueError, match=r"1 users are not lists of item ids \(users 'u1'\)"):
        load_lcrec(tmp_path)


def test_missing_column_error_lists_at_most_ten_columns(tmp_path):
    """A JSON object with thousands of keys read as a table: the message stays readable."""
    path = tmp_path / "wide.jsonl"
    path.write_text(json.dumps({f"user{i}": [f"i{i}"] for i in range(8317)}) + "\n")
    with pytest.raises(CatalogueError) as err:
        load_table(path)
    message = str(err.value)
    assert "and 8307 more" in message and len(message) < 400


def test_amazon_folder_with_several_or_no_review_files(tmp_path, caplog):
    _, reviews = write_amazon(tmp_path, 2018)
    (tmp_path / f"{reviews.name}.copy").write_bytes(reviews.read_bytes())
    with pytest.raises(CatalogueError, match=r"2 review files.*reviews=\.\.\. \(--reviews FILE\)"):
        load_catalogue(tmp_path)
    assert load_catalogue(tmp_path, reviews=reviews).sequences == EXPECTED_SEQUENCES  # the one named
    for path in (reviews, tmp_path / f"{reviews.name}.copy"):
        path.unlink()
    with caplog.at_level("WARNING", logger="peft_grounded.sids.loaders"):
        cat = load_catalogue(tmp_path)
    assert cat.sequences == {} and "no review file" in caplog.text and "no interactions" in caplog.text
