"""Diagnostics on constructed geometries whose answers are known in advance."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from peft_grounded.diagnostics.matrices import (
    Spectrum,
    cosine_similarity_matrix,
    effective_rank,
    nearest_vocabulary,
    neighbourhood_purity,
    pearson,
    rankdata,
    rsa,
    spearman,
    spectrum,
    stable_rank,
)
from peft_grounded.diagnostics.measure import (
    pc_regression_curve,
    pc_regression_r2,
    principal_components,
    principal_score,
)
from peft_grounded.diagnostics.snapshot import heatmap_matrix, parse_sid_token, select_heatmap_tokens
from peft_grounded.sids.index import sid_vocabulary


def orthonormal(n: int, d: int, seed: int = 0) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, n)))
    return q.T  # n orthonormal rows of width d


def clustered(n_clusters: int, per_cluster: int, d: int = 16, noise: float = 0.05, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_clusters, d))
    labels = np.repeat(np.arange(n_clusters), per_cluster)
    return centres[labels] + noise * rng.normal(size=(labels.size, d)), labels


# ---------------------------------------------------------------------------------------- spectrum


def test_identical_rows_have_effective_rank_one_and_no_centred_spread():
    row = np.random.default_rng(1).normal(size=24) * 0.1  # float64 values whose mean is not exact
    rows = np.tile(row, (7, 1))
    raw, centred = spectrum(rows), spectrum(rows, center=True)
    assert raw.effective_rank == pytest.approx(1.0)
    assert raw.stable_rank == pytest.approx(1.0)
    assert centred.effective_rank == 0.0 and centred.stable_rank == 0.0
    assert not centred.singular_values.any()


def test_orthonormal_rows_have_full_effective_and_stable_rank():
    rows = torch.tensor(orthonormal(6, 10), dtype=torch.float32)  # torch input, float32
    result = spectrum(rows)
    assert result.effective_rank == pytest.approx(6.0, rel=1e-5)
    assert result.stable_rank == pytest.approx(6.0, rel=1e-5)
    assert np.allclose(result.singular_values, 1.0, atol=1e-6)


def test_ranks_follow_their_formulas_on_a_known_spectrum():
    rows = orthonormal(2, 5) * np.array([[3.0], [1.0]])  # singular values 3 and 1
    p = np.array([0.75, 0.25])
    assert effective_rank(rows) == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    assert stable_rank(rows) == pytest.approx((9 + 1) / 9)


def test_centring_removes_a_shared_offset():
    rows = orthonormal(4, 8) + 50.0 * np.ones(8)  # a large common offset dominates the raw spectrum
    assert effective_rank(rows) < 1.5
    assert effective_rank(rows, center=True) > 2.5  # 4 points span 3 directions around their mean


def test_nan_rows_are_rejected_by_name():
    rows = np.ones((3, 4))
    rows[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"1 row\(s\) with NaN"):
        spectrum(rows)


# ---------------------------------------------------------------------------------------------- RSA


def test_rsa_of_a_geometry_with_itself_is_one_even_rotated_scaled_and_wider():
    reference, _ = clustered(5, 12)
    rotation = orthonormal(16, 32, seed=3)  # 16 x 32 with orthonormal rows: an isometry into R^32
    learned = 7.0 * reference @ rotation
    for result in (rsa(reference, reference), rsa(reference, learned)):
        assert result.pearson == pytest.approx(1.0)
        assert result.spearman == pytest.approx(1.0)
        assert result.n_pairs == 60 * 59 // 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rsa_with_a_shuffled_assignment_is_near_zero(seed):
    reference, _ = clustered(6, 20, noise=0.3, seed=seed)
    shuffled = reference[np.random.default_rng(seed + 10).permutation(len(reference))]
    result = rsa(reference, shuffled)
    assert abs(result.pearson) < 0.1 and abs(result.spearman) < 0.1


def test_rsa_degrades_with_noise():
    reference, _ = clustered(6, 20, noise=0.3)
    noise = np.random.default_rng(5).normal(size=reference.shape)
    values = [rsa(reference, reference + scale * noise).pearson for scale in (0.1, 1.0, 5.0)]
    assert values[0] > values[1] > values[2]


def test_rsa_of_identical_rows_is_undefined_not_noise():
    reference, _ = clustered(3, 5)
    result = rsa(reference, np.tile(reference.mean(0), (15, 1)))
    assert math.isnan(result.pearson) and math.isnan(result.spearman)


def test_rsa_refuses_mismatched_tokens():
    with pytest.raises(ValueError, match="one reference vector per SID token"):
        rsa(np.ones((5, 3)), np.ones((6, 3)))


def test_spearman_averages_tied_ranks():
    assert rankdata(np.array([10.0, 20.0, 10.0, 30.0])).tolist() == [1.5, 3.0, 1.5, 4.0]
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(x, x**3) == pytest.approx(1.0)  # monotone, not linear
    assert pearson(x, x**3) < 1.0


# ------------------------------------------------------------------------------------------- purity


def test_perfectly_clustered_tokens_have_purity_one():
    rows, labels = clustered(4, 12)
    result = neighbourhood_purity(rows, [f"cat{c}" for c in labels], m=10)
    assert result.purity == pytest.approx(1.0)
    assert result.chance == pytest.approx(11 / 47)
    assert result.n_tokens == 48 and result.m == 10


def test_identical_rows_give_chance_purity_whatever_the_token_order():
    labels = ["x"] * 6 + ["y"] * 3 + ["z"] * 3  # sorted: an index-order tie-break would look pure
    result = neighbourhood_purity(np.ones((12, 4)), labels, m=3)
    assert result.purity == pytest.approx(result.chance)


def test_purity_ignores_unlabelled_tokens_and_is_low_for_unrelated_labels():
    rows, labels = clustered(4, 12)
    shuffled = np.random.default_rng(0).permutation(labels)
    low = neighbourhood_purity(rows, list(shuffled), m=5)
    assert low.purity < 0.5
    with_unlabelled = [*map(int, labels), None, None]
    extra = np.vstack([rows, rows[:2]])  # duplicates of cluster-0 rows, unlabelled: not neighbours
    assert neighbourhood_purity(extra, with_unlabelled, m=10).purity == pytest.approx(1.0)


def test_purity_rejects_too_many_neighbours_and_misaligned_labels():
    with pytest.raises(ValueError, match="only 3 other labelled tokens"):
        neighbourhood_purity(np.eye(4), ["a", "a", "b", "b"], m=4)
    with pytest.raises(ValueError, match="one label"):
        neighbourhood_purity(np.eye(4), ["a", "b"], m=1)


# ------------------------------------------------------------------------------------- popularity R^2


def popularity_rows(n: int = 80, d: int = 24, seed: int = 0):
    """Rows = a shared base + frequency x a popularity axis + small semantic noise."""
    rng = np.random.default_rng(seed)
    frequency = rng.zipf(1.8, size=n).clip(max=500).astype(float)
    axis = rng.normal(size=d)
    rows = rng.normal(size=d) + np.outer(frequency, axis) + 0.01 * rng.normal(size=(n, d))
    return rows, frequency


def test_rows_along_a_popularity_axis_give_r2_near_one():
    rows, frequency = popularity_rows()
    assert pc_regression_r2(rows, frequency, q=1).r2 > 0.99
    cv = pc_regression_r2(rows, frequency, q=3, cv_folds=5)
    assert cv.cross_validated and cv.folds == 5 and cv.r2 > 0.99
    semantic = np.random.default_rng(9).normal(size=len(frequency))  # unrelated to the geometry
    assert pc_regression_r2(rows, semantic, q=1).r2 < 0.1


def test_rows_built_from_semantics_do_not_predict_popularity():
    rows, _ = clustered(5, 16, noise=0.2)
    semantic = principal_score(rows, 0)
    frequency = np.random.default_rng(4).zipf(1.8, size=len(rows)).clip(max=500).astype(float)
    assert pc_regression_r2(rows, semantic, q=3).r2 > 0.99
    assert pc_regression_r2(rows, frequency, q=3, cv_folds=5).r2 < 0.2


def test_r2_curve_is_monotone_in_sample_and_q_is_clamped():
    rows, frequency = popularity_rows(n=30, d=4)
    curve = pc_regression_curve(rows, frequency + np.random.default_rng(1).normal(size=30), max_q=8)
    r2 = [c.r2 for c in curve]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(r2))
    assert curve[-1].q == 4  # only 4 principal components exist


def test_identical_rows_explain_nothing_and_constant_targets_are_undefined():
    rows = np.ones((10, 5))
    result = pc_regression_r2(rows, np.arange(10.0), q=3)
    assert result.q == 0 and result.r2 == pytest.approx(0.0)
    assert math.isnan(pc_regression_r2(popularity_rows()[0], np.ones(80)).r2)
    with pytest.raises(ValueError, match="80 tokens"):
        pc_regression_r2(popularity_rows()[0], np.ones(79))


# ----------------------------------------------------------------------------------- nearest tokens


def test_nearest_vocabulary_matches_brute_force_and_respects_exclusions():
    rng = np.random.default_rng(0)
    vocab = rng.normal(size=(300, 12))
    sids = np.vstack([3.0 * vocab[7] + 1e-3 * rng.normal(size=12), rng.normal(size=(9, 12))])
    result = nearest_vocabulary(torch.tensor(sids), torch.tensor(vocab), k=4, chunk_size=3)
    assert result.ids.shape == (10, 4) and result.ids.dtype == np.int64
    assert result.ids[0, 0] == 7 and result.scores[0, 0] == pytest.approx(1.0, abs=1e-4)
    expected = np.argsort(-cosine_similarity_matrix(sids, vocab), axis=1)[:, :4]
    assert (result.ids == expected).all()
    assert (np.diff(result.scores, axis=1) <= 1e-7).all()
    excluded = nearest_vocabulary(sids, vocab, k=4, exclude_ids=[7])
    assert 7 not in excluded.ids
    with pytest.raises(ValueError, match="width"):
        nearest_vocabulary(sids, vocab[:, :5])


# ------------------------------------------------------------------------------------------ heatmap


def test_heatmap_selection_spreads_over_levels_and_orders_by_prefix():
    tokens = sid_vocabulary([8, 8, 8])
    shuffled = [tokens[i] for i in np.random.default_rng(0).permutation(len(tokens))]
    selection = select_heatmap_tokens(shuffled, n_sid=10, vocab_size=1000, n_text=6, seed=1)
    picked = [shuffled[i] for i in selection.sid_indices]
    keys = [parse_sid_token(t) for t in picked]
    assert keys == sorted(keys)
    assert selection.sid_groups == ("a",) * 4 + ("b",) * 3 + ("c",) * 3
    assert picked[0] == "<a_0>" and picked[3] == "<a_7>"  # evenly over the codes, ends included
    assert selection.text_ids.tolist() == sorted(set(selection.text_ids.tolist()))
    assert len(selection.text_ids) == 6 and selection.text_ids.max() < 1000
    again = select_heatmap_tokens(shuffled, n_sid=10, vocab_size=1000, n_text=6, seed=1)
    assert (again.text_ids == selection.text_ids).all() and not selection.notes


def test_heatmap_selection_clamps_with_a_note_or_raises_when_strict():
    tokens = sid_vocabulary([8, 8, 8])
    selection = select_heatmap_tokens(tokens, n_sid=50, vocab_size=30, n_text=50)
    assert len(selection.sid_indices) == 24 and len(selection.text_ids) == 30
    assert any("only 24 exist" in note for note in selection.notes)
    assert any("vocabulary has 30 eligible" in note for note in selection.notes)
    excluded = select_heatmap_tokens(tokens, n_sid=3, vocab_size=30, n_text=50, exclude_ids=[0, 5])
    assert len(excluded.text_ids) == 28 and not {0, 5} & set(excluded.text_ids.tolist())
    with pytest.raises(ValueError, match="only 24 exist; lower n_sid"):
        select_heatmap_tokens(tokens, n_sid=50, vocab_size=30, n_text=5, strict=True)
    custom = select_heatmap_tokens(["[x10]", "[x2]", "[x1]"], n_sid=3)  # unknown template: one block
    assert custom.sid_indices.tolist() == [2, 1, 0] and custom.sid_groups == ("SID",) * 3
    assert any("SID tokens only" in note for note in custom.notes)


def test_mean_init_rows_make_a_uniform_block():
    """Mean init as METHODS.md defines it: every new row is the vocabulary mean.

    Built here by hand; once the adapter exists, a test should take its ``init="mean"`` rows instead.
    """
    rng = np.random.default_rng(0)
    vocab = rng.normal(size=(200, 16))
    tokens = sid_vocabulary([4, 4])
    rows = np.tile(vocab.mean(0), (len(tokens), 1))
    selection = select_heatmap_tokens(tokens, n_sid=8, vocab_size=200, n_text=5)
    matrix = heatmap_matrix(torch.tensor(rows), selection, torch.tensor(vocab))
    assert matrix.shape == (13, 13)
    assert np.allclose(matrix[5:, 5:], 1.0)  # the SID block: all identical
    assert not np.allclose(matrix[:5, :5], 1.0)
    assert spectrum(rows).effective_rank == pytest.approx(1.0)
    assert spectrum(rows, center=True).effective_rank == 0.0
    assert math.isnan(rsa(rng.normal(size=(8, 3)), rows).pearson)


def test_one_pca_serves_the_centred_spectrum_and_every_target():
    rows, frequency = popularity_rows(n=40, d=6)
    pcs = principal_components(rows)
    centred = spectrum(rows, center=True)
    assert np.allclose(pcs.singular_values, centred.singular_values)
    reused = Spectrum.from_singular_values(pcs.singular_values, centred=True)
    assert reused.effective_rank == pytest.approx(centred.effective_rank)
    assert pc_regression_r2(pcs, frequency, q=2).r2 == pytest.approx(
        pc_regression_r2(rows, frequency, q=2).r2
    )


def test_a_bf16_target_tensor_is_read_in_float64():
    """Per-token targets (e.g. frequencies) may come as bf16 tensors, which numpy cannot hold."""
    from peft_grounded.diagnostics.matrices import as_vector

    target = torch.tensor([1.0, 2.0, 3.5], dtype=torch.bfloat16)
    assert as_vector(target, 3, "target").tolist() == [1.0, 2.0, 3.5]
    rows = np.random.default_rng(0).normal(size=(12, 6))
    assert pc_regression_r2(rows, torch.arange(12, dtype=torch.bfloat16), q=2).q == 2
