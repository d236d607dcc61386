"""Hydra's ConfigStore: every schema, and the options that need no YAML.

- ``config_schema`` and ``schema/{model,data,logger}/base``: the hand-written structured configs
  (:mod:`evals.core.config.structured`).
- ``schema/scaling/<strategy>`` and ``schema/eval/<name>``: one per registered strategy (generated,
  :mod:`evals.core.config.schemas`) and eval (the dataclass it registers, ``evals.core.registry``).
- Options: ``conf/<group>/<option>.yaml`` exists only where an option sets values; it names its schema first in
  its defaults list (``- /schema/<group>@_here_: <name>``). Every built-in strategy and eval without one gets its
  option here, generated: ``scaling=<strategy>`` and ``eval=<name>`` are the schema as it is (the registered
  defaults), the way ``eval=suite`` (:func:`evals.core.config.schemas.suite_schema`) always was. What each
  generated option is: :data:`ABOUT`. A plugin's strategy or eval (``$ROPE_EXT_PLUGINS``) still brings its own
  YAML on ``hydra.searchpath``: a ConfigStore option of the same name would collide with it (Hydra's deprecated
  automatic schema matching).

:func:`config_dir` finds ``conf/`` (shipped inside the package, or the checkout's).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from .schemas import scaling_schema, suite_schema
from .structured import Config, DataConfig, LoggerConfig, ModelConfig

# What each generated option is (the documentation its YAML carried before the option was generated).
ABOUT = {
    "scaling": {
        "dca": "Dual Chunk Attention (An et al. 2024, arXiv 2402.17463; HKUNLP/ChunkLlama): chunks of chunk_size - "
        "local_window tokens, intra-, successive- and inter-chunk relative positions; defaults chunk_size 3L/4, "
        "local_window L/16. Composes with a frequency strategy as Qwen2.5-1M: scaling=compose "
        "scaling.stages='[{name: yarn, factor: 4}, {name: dca}]'.",
        "dynamic_ntk": "Dynamic NTK (emozilla 2023): the NTK base follows the current length beyond the trained "
        "context.",
        "leaky_rerope": "Leaky ReRoPE (Su 2023, kexue.fm/archives/9708): beyond the window W the relative position "
        "is W + (m - n - W) / leak; the reference's log-n query scale (logn: false to leave it out).",
        "linear": "Positional interpolation (Chen et al. 2023, arXiv 2306.15595): positions / factor.",
        "llama3": "Llama-3.1 frequency scaling: wavelengths > L/low_freq_factor interpolated, < L/high_freq_factor "
        "kept, blended between. factor: target / L (default 2; Llama-3.1 ships 8), set by target= when not given.",
        "lm_infinite": "LM-Infinite (Han et al. 2023, arXiv 2308.16137): a Lambda-shaped mask -- the last "
        "local_span keys (default L) at their own distance, the first global_tokens (10) at distance local_span, "
        "nothing in between.",
        "logn": "Log-n query scaling beyond the trained length L (Su 2021, kexue.fm/archives/8823; Qwen logn-attn): "
        "the query at position m (n = m + 1 tokens seen) times max(1, log n / log L); form llama4: 1 + attn_scale "
        "* log1p(floor(n / floor_scale)). Not a frequency change: combine with one, e.g. scaling=compose "
        "scaling.stages='[{name: yarn, factor: 2}, {name: logn}]'.",
        "longrope": "LongRoPE (Ding et al. 2024, arXiv 2402.13753): per-pair factor lists (d/2 values each), "
        "searched for a model and a target length. Give yours: scaling.short_factor=[...] "
        "scaling.long_factor=[...]; factor = target / trained (default 2, set by target= when not given).",
        "none": "The model's own RoPE, untouched.",
        "ntk": "NTK-aware (bloc97 2023): base * factor^(d/(d-2)).",
        "ntk_by_parts": "NTK-by-parts (Peng et al. 2023, arXiv 2309.00071, section 3.2): the YaRN ramp without the "
        "attention temperature.",
        "p_rope": "p-RoPE (Barbero et al. 2024, arXiv 2410.06205): the floor(fraction * d/2) highest-frequency "
        "pairs keep rotating, the rest get theta = 0 and carry no position. fraction 1 is RoPE.",
        "rerope": "ReRoPE (Su 2023, kexue.fm/archives/9708; bojone/rerope): relative position min(m - n, window), "
        "the query scaled by max(1, log(m+1) / log L) as in the reference (logn: false to leave it out).",
        "self_extend": "Self-Extend (Jin et al. 2024, arXiv 2401.01325): pairs closer than the window W keep their "
        "positions; beyond, query and key positions are floor-divided by the group size G (grouped relative "
        "position m//G - n//G + W - W//G). The paper's rule for a target length N: (1/2 to 2/3) * L > W + (N - W) "
        "/ G, e.g. scaling.group_size=8 scaling.window=1024.",
        "string": "STRING (An et al. 2024, arXiv 2410.18745): pairs at m - n >= offset (default int(0.33 L)) see "
        "m - n - offset + local_window (128); cos/sin times the attention factor 0.1 ln 2 + 1, as the reference "
        "code.",
        "yarn": "YaRN (Peng et al. 2023, arXiv 2309.00071): NTK-by-parts ramp between beta_fast and beta_slow "
        "rotations + 0.1 ln(s) + 1 attention temperature; defaults from the registry (factor 2, beta_fast 32, "
        "beta_slow 1).",
    },
    "eval": {
        "lm_eval": "EleutherAI lm-evaluation-harness tasks on the patched model. rope_ext tasks run offline: "
        "rope_ext_passkey, rope_ext_needle (metadata.max_seq_lengths), rope_ext_books (rolling perplexity). Hub "
        "tasks by name when the hub is reachable: eval.tasks=[hellaswag] eval.limit=100.",
        "qk_study": "The model's own q and k over real text: per layer x head x rotary pair mean, variance and "
        "energy; each head's score profile (measured by FFT cross-correlation, and from the means alone) with the "
        "model's RoPE and the strategy's; locality per head and the tinymind conjecture's claims tested across "
        "heads (arXiv 2410.06205).",
        "rope_decay": "Analytic RoPE studies (RoFormer decay, Men et al. 2024 base bound) on the model's RoPE "
        "geometry. No weights needed.",
        "ruler": "RULER (Hsieh et al. 2024) offline: the 11 synthetic tasks from lm-eval's own generators and "
        "scoring, the corpus (data=) as the essay haystack, the model's tokenizer; eval.limit samples per task and "
        "length. eval.tasks=[niah_single_1,vt] for a subset; qa_squad, qa_hotpot only when named (they need the "
        "network).",
    },
}


def config_dir() -> Path:
    """The ``conf/`` directory: inside the installed package (``pip install .``), else the checkout's."""
    shipped = Path(__file__).resolve().parents[2] / "conf"
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[3] / "conf"


def written_options(group: str) -> set[str]:
    """The options of ``group`` that have a YAML in ``conf/``."""
    return {path.stem for path in (config_dir() / group).glob("*.yaml")}


def built_in(fn) -> bool:
    """Whether a registration (its function) is built in -- rope_ext's or evals' own, not a plugin's: only a
    built-in strategy or eval gets an option generated when it has no YAML."""
    return fn.__module__.split(".")[0] in ("rope_ext", "evals")


def register_configs() -> None:
    """Store every schema and every generated option in Hydra's ConfigStore, from the registries as they are now
    (call again after registering a strategy or an eval of your own)."""
    from rope_ext import STRATEGIES

    from ..registry import EVALS

    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, node in [("model", ModelConfig), ("data", DataConfig), ("logger", LoggerConfig)]:
        store.store(group=f"schema/{group}", name="base", node=node)
    written = written_options("scaling")
    for name, strategy in STRATEGIES.items():
        schema = scaling_schema(strategy)
        store.store(group="schema/scaling", name=name, node=schema)
        if name not in written and built_in(strategy.fn):
            store.store(group="scaling", name=name, node=schema)
    written = written_options("eval")
    for name, spec in EVALS.items():
        if name == "suite":
            continue
        store.store(group="schema/eval", name=name, node=spec.config)
        if name not in written and built_in(spec.run):
            named = next((f.default for f in fields(spec.config) if f.name == "name"), None) == name
            store.store(group="eval", name=name, node=spec.config if named else _named(spec.config, name))
    store.store(group="eval", name="suite", node=suite_schema(EVALS))


def _named(schema: type, name: str):
    """An eval's schema with its ``name`` set to the option's (an eval that shares another's dataclass)."""
    return OmegaConf.merge(OmegaConf.structured(schema), {"name": name})
