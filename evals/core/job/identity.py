"""A job's identity -- everything that changes a number: the model's weights and tokenizer files, dtype and device
type (:mod:`evals.core.inputs.models`), the effective scaling and the layers it scales, the eval config as far as
it changes a number, the data content, the seed, the numeric packages' versions and the code -- and its hash, the
job key that resume and the report go by (:func:`digest`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import rope_ext

from ..config.fields import identity_fields
from ..registry import EvalSpec
from .job import parts

KEY_PACKAGES = ("torch", "transformers", "gguf", "lm-eval")


@functools.lru_cache(maxsize=None)
def _source_hash(paths: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


def code_files(*functions) -> tuple[str, ...]:
    """rope_ext's and evals' source (lm-eval task YAMLs and their ``*_yaml`` templates included), and the
    files defining ``functions`` (plugins)."""
    roots = [Path(rope_ext.__file__).parent, Path(__file__).resolve().parents[2]]  # evals/
    files = {
        str(p)
        for root in roots
        for p in root.rglob("*")
        if (p.suffix in (".py", ".yaml") or p.name.endswith("_yaml")) and p.is_file()
    }
    for fn in functions:
        with_source = inspect.getsourcefile(fn)
        if with_source:
            files.add(with_source)
    return tuple(sorted(files))


def code_identity(*functions) -> str:
    """A hash of :func:`code_files`: a change to any of them is another job."""
    return _source_hash(code_files(*functions))


def scaling_identity(scaling: rope_ext.Scaling, scaled) -> dict:
    """The effective scaling with the layer types it actually scales (``auto`` and the names it resolves
    to are the same job)."""
    effective = scaling.effective()
    if scaling.name != "none" and scaled is not None:
        effective["layer_types"] = sorted({str(s.layer_type) for s in scaled})
    return effective


def eval_identity(spec: EvalSpec, cfg, role: str = "key") -> Any:
    """The eval config as far as it changes a number (``role="key"``), or the number at a given length
    (``role="compare"``): the fields declared otherwise left out; a suite: its members' by name."""
    if spec.parts is None:
        return identity_fields(spec.config, cfg, role)
    return {part_spec.name: identity_fields(part_spec.config, part, role) for part_spec, part, _ in parts(spec, cfg)}


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
