"""Residual k-means: cluster recovery, determinism, balance, edge cases and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers.sids_fixtures import clustered_vectors, purity

from peft_grounded.sids.kmeans import QuantizationError, assign, balanced_assign, kmeans
from peft_grounded.sids.quantizers import RQKMeansConfig, fit_rqkmeans, quantize


def test_level_codes_recover_the_clusters():
    x, cluster, offset = clustered_vectors(n_clusters=8, sub=4, per_sub=12)
    fit = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(8, 4), seed=0))
    codes = fit.codes.numpy()
    assert purity(codes[:, 0], cluster) >= 0.99  # level 0: the clusters
    assert purity(codes[:, 1], offset) >= 0.95  # level 1, on the residuals: the shared offsets
    assert fit.level_mse[0] < 0.2 * fit.input_mse and fit.level_mse[1] < fit.level_mse[0]


def test_deterministic_under_a_seed():
    x, _, _ = clustered_vectors(seed=1)
    cfg = RQKMeansConfig(codes_per_level=(16, 8, 8), seed=3, balanced="last")
    a, b = fit_rqkmeans(x, cfg), fit_rqkmeans(x, cfg)
    assert torch.equal(a.codes, b.codes)
    assert all(torch.equal(p, q) for p, q in zip(a.codebooks, b.codebooks, strict=True))
    c = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(16, 8, 8), seed=4, balanced="last"))
    assert not all(torch.equal(p, q) for p, q in zip(a.codebooks, c.codebooks, strict=True))


def test_codes_are_nearest_codewords_and_quantize_reproduces_them():
    x, _, _ = clustered_vectors(seed=2)
    fit = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(8, 8), seed=0))
    codes, residual = quantize(x, fit.codebooks)
    assert torch.equal(codes, fit.codes)
    assert torch.allclose(residual, fit.residual, atol=1e-5)
    recon = sum(book[fit.codes[:, lv]] for lv, book in enumerate(fit.codebooks))
    assert torch.allclose(torch.as_tensor(x) - recon, fit.residual, atol=1e-4)


def test_kmeans_plusplus_beats_bad_luck_on_separated_clusters():
    x, top, _ = clustered_vectors(n_clusters=16, sub=1, per_sub=20, seed=5)
    for seed in range(3):
        result = kmeans(torch.as_tensor(x), 16, generator=torch.Generator().manual_seed(seed))
        assert purity(result.labels.numpy(), top) == 1.0


def test_balanced_assignment_respects_capacity():
    rng = np.random.default_rng(0)
    # a lopsided data set: 90% of the points around one centre
    x = np.concatenate([rng.normal(size=(900, 8)) * 0.1, rng.normal(size=(100, 8)) * 0.1 + 5]).astype(
        np.float32
    )
    xt = torch.as_tensor(x)
    centroids = xt[torch.tensor([0, 1, 2, 950])]
    labels, dist = balanced_assign(xt, centroids, capacity=250, candidates=2)
    assert torch.bincount(labels, minlength=4).tolist() == [250, 250, 250, 250]
    assert torch.allclose(dist, ((xt - centroids[labels]) ** 2).sum(1), rtol=1e-4, atol=1e-4)
    plain, _ = assign(xt, centroids)
    # points of the small far cluster keep their own centroid
    assert (labels[900:] == plain[900:]).float().mean() == 1.0
    result = kmeans(xt, 10, balanced=True)
    assert torch.bincount(result.labels, minlength=10).max() <= math.ceil(1000 / 10)


def test_balanced_levels_spread_items_more_evenly():
    x, _, _ = clustered_vectors(n_clusters=3, sub=2, per_sub=40, seed=6)  # 3 big clusters for 16 codes
    plain = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(16,), seed=0)).codes[:, 0]
    balanced = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(16,), seed=0, balanced="all")).codes[:, 0]
    assert torch.bincount(balanced).max() <= math.ceil(len(x) / 16)
    assert torch.bincount(balanced).max() < torch.bincount(plain).max()


def test_normalized_residuals_are_unit_norm_before_each_level():
    x, _, _ = clustered_vectors(seed=7)
    cfg = RQKMeansConfig(codes_per_level=(8, 8), normalize_residuals=True)
    fit = fit_rqkmeans(x, cfg)
    codes, _ = quantize(x, fit.codebooks, normalize_residuals=True)
    assert torch.equal(codes, fit.codes)
    # level-0 codewords are means of unit vectors: norm at most 1
    assert fit.codebooks[0].norm(dim=1).max() <= 1.0 + 1e-5


def test_sample_size_fits_on_a_subsample_and_codes_everything():
    x, top, _ = clustered_vectors(n_clusters=8, sub=2, per_sub=30, seed=8)
    fit = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(8, 4), sample_size=240, seed=0))
    assert fit.codes.shape == (len(x), 2)
    assert purity(fit.codes[:, 0].numpy(), top) >= 0.99
    bal = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(8,), sample_size=240, balanced="all"))
    assert torch.bincount(bal.codes[:, 0]).max() <= math.ceil(len(x) / 8)


def test_duplicate_points_fewer_distinct_than_k():
    x = np.repeat(np.eye(4, dtype=np.float32), 5, axis=0)  # 4 distinct points, 20 rows
    fit = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(8,)))
    assert fit.level_mse[0] == pytest.approx(0.0, abs=1e-4)  # split clusters sit 1e-3 apart
    assert len(torch.unique(fit.codes[:, 0])) == 4


def test_k_larger_than_items_is_a_clear_error():
    x = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    with pytest.raises(QuantizationError, match=r"256 codes per level but only 10 items.*--codes 8"):
        fit_rqkmeans(x)


def test_nan_vectors_are_a_clear_error():
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    x[[3, 7]] = np.nan
    x[9, 0] = np.inf
    with pytest.raises(QuantizationError, match=r"3 rows hold NaN or inf \(rows \[3, 7, 9\]\).*encoder"):
        fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(4,)))


def test_bad_shapes_and_settings():
    with pytest.raises(QuantizationError, match="empty"):
        fit_rqkmeans(np.zeros((0, 4), np.float32))
    with pytest.raises(QuantizationError, match="2-D"):
        fit_rqkmeans(np.zeros(10, np.float32), RQKMeansConfig(codes_per_level=(2,)))
    with pytest.raises(QuantizationError, match="balanced must be"):
        RQKMeansConfig(balanced="yes")
    with pytest.raises(QuantizationError, match="dimension 3 but the codebooks 4"):
        quantize(np.zeros((2, 3), np.float32), [torch.zeros(2, 4)])


def test_dead_codes_restart_on_isotropic_data():
    # In high dimension the seed with the smallest norm is everyone's nearest; without restarts the deeper
    # levels keep codes with a single item or a few, and one crowded code.
    x = np.random.default_rng(0).standard_normal((12000, 384)).astype(np.float32)

    def smallest(fraction):
        fit = fit_rqkmeans(x, RQKMeansConfig(codes_per_level=(64, 64, 64), seed=0, dead_fraction=fraction))
        return min(int(torch.bincount(fit.codes[:, lv], minlength=64).min()) for lv in range(3))

    assert smallest(0.0) <= 2
    assert smallest(0.05) >= 8  # mean cluster size 187; dead below 9.4 during the iterations
