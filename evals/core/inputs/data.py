"""Long documents for the evals, tokenized once and cached.

Sources (``conf/data/*.yaml``):
- ``books``: the six Jane Austen novels of Debian's ``r-cran-janeaustenr`` (public domain, Project
  Gutenberg text), fetched at set-up and read by :mod:`evals.setup.books` (fetched here too when the
  cache lacks them). Nothing of the text is kept in the repository.
- ``text_files``: any local UTF-8 files matching a glob.
- ``hub``: a Hugging Face dataset (PG-19, Proof-pile, GovReport); a clear error when offline.

Token ids are cached under ``<cache>/tokens/`` keyed by the tokenizer and a hash of the text.
:func:`data_identity` checks a data config and fingerprints its content (the novels' database, every
text file's bytes) before anything is tokenized, so a bad file is one clear line and a changed corpus
a different job. The set-up download is ``python -m evals.setup.books fetch`` (:mod:`evals.setup.books`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator
import glob as globlib
import hashlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..files import cache_dir, note_once, read_cache, sha256_file, write_cache
from ..config.structured import AUSTEN_BOOKS
from ..errors import DataError
from ..progress import progress
from ...setup.books import fetch_austen, read_austen

if TYPE_CHECKING:
    import torch


@dataclass
class Document:
    name: str
    ids: torch.Tensor  # (n,) int64 token ids
    text: str | None = field(default=None, repr=False)  # what ``ids`` tokenize (LongPPL maps key spans through it)


def _hub_texts(cfg) -> list[tuple[str, str]]:
    from .hub import hub_reachable

    if not hub_reachable():
        raise DataError(
            f"data '{cfg.name}' ({cfg.hub_id}) needs the Hugging Face hub, which is not reachable. "
            f"Offline, use data=books or data=text_files data.glob='/path/*.txt'"
        )
    try:
        import datasets

        dataset = datasets.load_dataset(cfg.hub_id, cfg.hub_config, split=cfg.split, streaming=True)
        rows = []
        for i, row in enumerate(dataset):
            if cfg.max_documents is not None and i >= cfg.max_documents:
                break
            rows.append((f"{cfg.name}-{i}", row[cfg.text_field]))
        return rows
    except Exception as err:  # datasets raises many types when the hub cannot be reached
        raise DataError(
            f"data '{cfg.name}' ({cfg.hub_id}) could not be read from the Hugging Face hub: {type(err).__name__}: "
            f"{str(err)[:200]}. Offline, use data=books or data=text_files data.glob='/path/*.txt'"
        ) from err


def text_files(cfg) -> list[Path]:
    if not cfg.glob:
        raise DataError("data=text_files needs data.glob='/path/to/*.txt'")
    paths = sorted(Path(p) for p in globlib.glob(os.path.expanduser(cfg.glob)) if Path(p).is_file())
    if not paths:
        raise DataError(f"data.glob={cfg.glob!r} matches no file")
    return paths[: cfg.max_documents] if cfg.max_documents is not None else paths


def read_text_file(path: Path) -> str:
    """A file's text; an empty or non-UTF-8 file is a DataError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"data file {path} is not UTF-8 text (byte {err.start}: {err.reason}); convert it or narrow data.glob"
        ) from None
    except OSError as err:
        raise DataError(f"data file {path} cannot be read: {err.strerror}") from None
    if not text.strip():
        raise DataError(f"data file {path} is empty; remove it or narrow data.glob")
    return text


def data_identity(cfg) -> dict:
    """Check a data config and fingerprint what it reads (no tokenization): the novels' database, each text
    file's content hash, or the hub dataset's name (its content cannot be seen before streaming)."""
    from omegaconf import OmegaConf

    identity = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(vars(cfg))
    identity.pop("cache_dir", None)
    if cfg.source == "books":
        identity["content"] = sha256_file(fetch_austen(cache_dir(cfg.cache_dir)) / "Rdata.rdb")
    elif cfg.source == "text_files":
        files = text_files(cfg)
        for path in files:
            read_text_file(path)
        identity["content"] = {str(p.resolve()): sha256_file(p) for p in files}
    else:
        from .hub import hub_reachable

        if not hub_reachable():
            raise DataError(
                f"data '{cfg.name}' ({cfg.hub_id}) needs the Hugging Face hub, which is not reachable. "
                f"Offline, use data=books or data=text_files data.glob='/path/*.txt'"
            )
    return identity


def document_count(cfg) -> int | None:
    """How many documents a data config reads, known without reading or tokenizing them (None for a hub
    dataset, whose size shows only when streamed); those under ``min_tokens`` are dropped later."""
    if cfg.source == "books":
        count = len(cfg.books or AUSTEN_BOOKS)
    elif cfg.source == "text_files":
        count = len(text_files(cfg))
    else:
        return None
    return min(count, cfg.max_documents) if cfg.max_documents is not None else count


def load_texts(cfg) -> list[tuple[str, str]]:
    """(name, text) pairs for a data config, in the configured order."""
    return list(_texts(cfg))


def _texts(cfg) -> Iterator[tuple[str, str]]:
    """load_texts' pairs one at a time: a novel is read from the database only when its turn comes."""
    if cfg.source == "books":
        data_dir = fetch_austen(cache_dir(cfg.cache_dir))
        names = list(cfg.books or AUSTEN_BOOKS)
        texts = ((b, read_austen(data_dir, [b])[b]) for b in names[: cfg.max_documents])
    elif cfg.source == "text_files":
        texts = iter([(p.stem, read_text_file(p)) for p in text_files(cfg)[: cfg.max_documents]])
    else:
        texts = iter(_hub_texts(cfg)[: cfg.max_documents])
    return texts


def tokenizer_key(tokenizer) -> str:
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(repr(sorted(vocab.items())[:: max(1, len(vocab) // 4096)]).encode()).hexdigest()[:12]
    return f"{Path(str(tokenizer.name_or_path)).name or 'tok'}-{len(vocab)}-{digest}"


def tokenize(tokenizer, name: str, text: str, root: Path) -> torch.Tensor:
    """Token ids of ``text`` (with the tokenizer's BOS, if it adds one), cached on disk."""
    import torch

    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = root / "tokens" / tokenizer_key(tokenizer) / f"{name}-{key}.pt"
    cached = read_cache(path, _token_ids, "token ids")
    if cached is not None:
        return cached
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64)
    buffer = io.BytesIO()
    torch.save(ids, buffer)
    write_cache(path, buffer.getvalue())
    return ids


def _token_ids(path: Path) -> torch.Tensor:
    """A cached token-id file: a 1-D int64 tensor, else an error (damaged)."""
    import torch

    ids = torch.load(path, weights_only=True)
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 1:
        raise ValueError(f"not a 1-D int64 tensor: {type(ids).__name__}")
    return ids


def load_documents(cfg, tokenizer, count: int | None = None, min_tokens: int = 0) -> list[Document]:
    """Tokenized documents of at least ``cfg.min_tokens`` tokens, in order; with ``count``, tokenizing stops
    once ``count`` of them have at least ``min_tokens`` tokens (the shorter ones read so far are returned too)."""
    root = cache_dir(cfg.cache_dir)
    texts = _texts(cfg)
    documents, enough, dropped = [], 0, []
    for name, text in progress(
        texts, "tokenize", "doc", document_count(cfg), stop=lambda: count is not None and enough >= count
    ):
        document = Document(name, tokenize(tokenizer, name, text, root), text)
        if len(document.ids) >= cfg.min_tokens:
            documents.append(document)
            enough += len(document.ids) >= min_tokens
        else:
            dropped.append(f"{name} ({len(document.ids)} tokens)")
    if dropped:
        note_once(
            f"note: data.min_tokens={cfg.min_tokens}: {len(dropped)} shorter documents not used: {', '.join(dropped)}"
        )
    return documents
