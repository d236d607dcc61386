"""The books corpus, fetched at set-up: the six Jane Austen novels of Debian's ``r-cran-janeaustenr`` (public
domain, Project Gutenberg text), downloaded once into the cache with ``apt-get download`` + ``dpkg-deb -x`` and
read from R's lazy-load database with PyPI ``rdata``. Nothing of the text is kept in the repository.
:mod:`evals.core.inputs.data` loads and tokenizes them for ``data=books`` (fetching them first if set-up did not).

    python -m evals.setup.books fetch    # what `make setup` runs
    python -m evals.setup.books stats    # each novel's length in characters
    python -m evals.setup.books export DIR   # the novels as UTF-8 text files, for data=text_files or your own use
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Iterable

from ..core.errors import DataError
from ..core.files import cache_dir, unwritable

AUSTEN_PACKAGE = "r-cran-janeaustenr"
AUSTEN_DATA = "janeaustenr/usr/lib/R/site-library/janeaustenr/data"  # where the package keeps them, under the cache
FETCH = "python -m evals.setup.books fetch"
USAGE = "usage: python -m evals.setup.books [fetch|stats|export DIR]"


def fetch_austen(root: Path) -> Path:
    """Download and unpack the Debian package once; returns the R data directory."""
    data_dir = root / AUSTEN_DATA
    if (data_dir / "Rdata.rdb").is_file():
        return data_dir
    with tempfile.TemporaryDirectory() as tmp:
        try:
            subprocess.run(["apt-get", "download", AUSTEN_PACKAGE], cwd=tmp, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as err:
            detail = getattr(err, "stderr", b"") or str(err)
            raise DataError(
                f"could not download Debian package {AUSTEN_PACKAGE} (needs apt and a reachable Debian mirror; "
                f"try `apt-get update`): {detail!s:.300}. Or use data=text_files data.glob='...'"
            ) from err
        deb = next(Path(tmp).glob("*.deb"))
        unpacked = subprocess.run(
            ["dpkg-deb", "-x", str(deb), str(root / "janeaustenr")], capture_output=True, text=True
        )
        if unpacked.returncode != 0 or not (data_dir / "Rdata.rdb").is_file():
            raise DataError(
                f"could not unpack {AUSTEN_PACKAGE} into the cache {root} ({unpacked.stderr.strip()[:200]}); "
                f"set data.cache_dir or $ROPE_EXT_CACHE to a writable directory"
            )
    return data_dir


_PARSED: dict[bytes, str] = {}  # a novel's compressed blob -> its text: each parsed once per process


def read_austen(data_dir: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """The novels as {name: text} from R's lazy-load database (Rdata.rdx index + Rdata.rdb blobs); with ``names``,
    only those (in the database's order). Parsing is the slow part (about 0.1 s per 1,000 lines): each novel is
    parsed once per process, remembered by its compressed bytes, so a sweep's jobs read it again for free."""
    import rdata

    def parse(raw: bytes):
        with warnings.catch_warnings():  # rdata cannot tell a bare serialization's type; it is RDS
            warnings.simplefilter("ignore", UserWarning)
            return rdata.conversion.convert(rdata.parser.parse_data(raw))

    wanted = None if names is None else set(names)
    index = parse(gzip.decompress((data_dir / "Rdata.rdx").read_bytes()))
    blob = (data_dir / "Rdata.rdb").read_bytes()
    books = {}
    for name, (offset, length) in index["variables"].items():
        if wanted is not None and str(name) not in wanted:
            continue
        # each entry: 4-byte length header, then a zlib-compressed serialized R character vector
        raw = blob[int(offset) + 4 : int(offset) + int(length)]
        if raw not in _PARSED:
            _PARSED[raw] = "\n".join(str(line) for line in parse(zlib.decompress(raw)))
        books[str(name)] = _PARSED[raw]
    return books


def export_austen(root: Path, out: Path) -> list[Path]:
    """Write the fetched novels into ``out`` (new or empty) as UTF-8 files ``<name>.txt``, named as ``data.books``
    names them, each exactly the text ``data=books`` reads; a DataError, before anything is written, when ``out``
    cannot take them or the books are not fetched yet (this never downloads)."""
    out = Path(out)
    if out.is_dir() and any(out.iterdir()):
        raise DataError(f"{out} is not empty; export into a new or empty directory (nothing is overwritten)")
    problem = unwritable(out) if not out.exists() or out.is_dir() else f"{out} is a file, not a directory"
    if problem:
        raise DataError(f"{out} cannot be written: {problem}; choose another directory")
    data_dir = root / AUSTEN_DATA
    if not (data_dir / "Rdata.rdb").is_file():
        raise DataError(f"the books are not fetched yet (no {data_dir / 'Rdata.rdb'}); run `{FETCH}` first")
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in read_austen(data_dir).items():
            path = out / f"{name}.txt"
            path.write_bytes(text.encode("utf-8"))
            written.append(path)
    except OSError as err:
        raise DataError(f"could not write the books into {out}: {err.strerror or err}") from None
    return written


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "fetch"
    if command not in ("fetch", "stats", "export") or max(len(argv), 1) != (2 if command == "export" else 1):
        print(USAGE, file=sys.stderr)
        return 2
    root = cache_dir()
    try:
        if command == "fetch":
            print(f"books: {fetch_austen(root)}")
        elif command == "stats":
            for name, text in read_austen(fetch_austen(root)).items():
                print(f"{name}: {len(text):,} characters")
        else:
            for path in export_austen(root, Path(argv[1]).expanduser()):
                print(f"{path}: {path.stat().st_size:,} bytes (UTF-8)")
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
