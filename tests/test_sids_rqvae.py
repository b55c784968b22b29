"""The RQ-VAE quantiser: cluster recovery, training, determinism, no collapse, and its SID index."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.sids_fixtures import clustered_vectors, purity, write_lcrec

from peft_grounded.cli import main
from peft_grounded.sids.build import index_from_vectors
from peft_grounded.sids.index import SIDIndex
from peft_grounded.sids.quantizers import QuantizationError, RQKMeansConfig, RQVAEConfig, fit_rqvae

SMALL = dict(latent_dim=8, hidden=(64, 32), batch_size=128)


@pytest.fixture(scope="module")
def data():
    return clustered_vectors(n_clusters=8, sub=4, per_sub=12)


def test_level_zero_recovers_the_clusters_and_training_helps(data):
    x, cluster, _ = data
    short = fit_rqvae(x, RQVAEConfig(codes_per_level=(8, 4), epochs=3, **SMALL))
    fit = fit_rqvae(x, RQVAEConfig(codes_per_level=(8, 4), epochs=60, **SMALL))
    assert purity(fit.codes[:, 0].numpy(), cluster) >= 0.95
    assert fit.reconstruction_mse < 0.5 * short.reconstruction_mse
    assert fit.reconstruction_mse < 0.1 * fit.input_mse
    assert fit.level_mse[-1] < 0.05  # the codes explain the latent almost entirely
    assert len(torch.unique(fit.codes[:, 0])) == 8 and len(torch.unique(fit.codes[:, 1])) == 4  # no collapse
    assert len(fit.stats["loss"]) == 60


def test_deterministic_and_leaves_the_global_rng_alone(data):
    x, _, _ = data
    cfg = RQVAEConfig(codes_per_level=(8, 4), epochs=5, seed=3, **SMALL)
    state = torch.random.get_rng_state()
    a, b = fit_rqvae(x, cfg), fit_rqvae(x, cfg)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a.codes, b.codes)
    assert all(torch.equal(p, q) for p, q in zip(a.codebooks, b.codebooks, strict=True))


def test_too_many_codes_is_a_clear_error():
    x = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    with pytest.raises(QuantizationError, match="256 codes per level but only 10 items"):
        fit_rqvae(x)


def test_rqvae_index(data, tmp_path):
    x, _, _ = data
    ids = [f"i{k}" for k in range(len(x))]
    index = index_from_vectors(
        x,
        ids,
        RQKMeansConfig(codes_per_level=(8, 4)),
        quantizer="rqvae",
        rqvae_config=RQVAEConfig(codes_per_level=(8, 4), epochs=20, **SMALL),
    )
    assert index.quantizer == "rqvae" and index.quality["quantizer"] == "rqvae"
    assert index.quality["collisions_after"]["collision_rate"] == 0
    assert index.centroids["items"].shape == (index.n_tokens, 32) and index.dim == 32
    assert index.centroids["codebook"].shape == (index.n_tokens, 8)  # latent space
    tokens, vectors = index.adapter_init("items")
    assert len(tokens) == vectors.shape[0] == index.n_tokens
    loaded = SIDIndex.load(index.save(tmp_path / "vae"))
    assert loaded.quantizer == "rqvae" and loaded.sid_texts() == index.sid_texts()
    assert loaded.build_config["latent_dim"] == 8
    with pytest.raises(ValueError, match=r"built by an rqvae.*rebuild"):
        loaded.quantize(x[:2])


def test_cli_rqvae(tmp_path, capsys):
    write_lcrec(tmp_path / "data")
    argv = ["build-sids", "--catalogue", str(tmp_path / "data"), "--codes", "2,2", "--quantizer", "rqvae"]
    rc = main(
        [
            *argv,
            "--rqvae-epochs",
            "3",
            "--output_dir",
            str(tmp_path / "o"),
            "--cache-dir",
            str(tmp_path / "c"),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    index = SIDIndex.load(tmp_path / "o")
    assert index.quantizer == "rqvae" and index.build_config["epochs"] == 3
