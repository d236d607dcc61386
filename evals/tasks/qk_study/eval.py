"""``eval=qk_study``: its config, early check and the eval itself -- capture and statistics
(:mod:`evals.tasks.qk_study.measure`), then tables and figures (:mod:`evals.tasks.qk_study.present`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import rope_ext

from ...core import projection_bias as biases
from ...core.config.fields import option
from ...core.inputs.data import document_count
from ...core.errors import UserError, scaling_errors_as_user_errors
from ...core.inputs.models import check_attention_hook
from ...core.registry import register_eval
from .measure import capture_layers, claims, dimension_rows, layer_rows, strategy_rows, summarize
from .present import write_outputs


class QKStudyError(UserError):
    pass


@dataclass
class QKStudyConfig:
    name: str = "qk_study"
    tokens: int = option(4096, minimum=64)  # tokens of real text in the one captured forward
    document: int = option(0, minimum=0)  # which document of the data (books: 0 = Emma)
    max_distance: Optional[int] = option(None, minimum=2)  # mean-field profiles up to here (null: 2 x trained context)
    near: int = option(16, minimum=1)  # locality: mean score over distances 1..near ...
    local_threshold: float = option(1.0, minimum=0)  # ... minus the far mean, in logits; >= this: a local head
    bins: int = option(64, minimum=8)  # log-spaced distance bins of the profile table and plots
    plot_heads: int = option(3, minimum=1)  # most local and most global heads plotted
    pair_samples: int = option(4096, minimum=64)  # random token pairs for the spread of a head's logits
    compare: List[Any] = field(
        default_factory=lambda: [
            {"name": "linear", "factor": 2.0},
            {"name": "ntk", "factor": 2.0},
            {"name": "yarn", "factor": 2.0},
            {"name": "p_rope", "fraction": 0.75},
        ]
    )  # strategies whose changed pairs are weighed by the energy there
    seed: int = 0
    ablate_bias: List[str] = option(
        [], choices=tuple(biases.PROJECTIONS)
    )  # biases changed for the study (evals/core/projection_bias.py)
    ablate_mode: str = option("zero", choices=biases.MODES)  # zero: b -> 0; center: b -> b - mean (q/k mean 0)


def _resolve_compare(cfg, job) -> list[rope_ext.Scaling]:
    with scaling_errors_as_user_errors():
        return [rope_ext.resolve(dict(entry), job.trained_context) for entry in cfg.compare]


def check_config(cfg, job) -> None:
    count = document_count(job.data_cfg)
    if count is not None and cfg.document >= count:
        raise QKStudyError(f"eval.document={cfg.document} but the data has {count} documents (0..{count - 1})")
    window = min(cfg.tokens, job.trained_context)
    if not cfg.near < window // 2:
        raise QKStudyError(
            f"eval.near={cfg.near} must be below half of min(eval.tokens, trained context) = {window // 2} "
            "(the far window is its second half)"
        )
    for k, entry in enumerate(cfg.compare):
        if not hasattr(entry, "get") or "name" not in entry:
            raise QKStudyError(f"eval.compare[{k}]={entry!r} must be a scaling config with a name")
    for scaling in _resolve_compare(cfg, job):
        for slot in job.model.slots or ():
            with scaling_errors_as_user_errors():
                scaling.frequencies(slot.dim, slot.base)
    check_attention_hook(job.model, "eval=qk_study captures q and k inside attention")
    biases.check(cfg.ablate_bias, job.model, "eval.ablate_bias", QKStudyError)


@register_eval(
    "qk_study", config=QKStudyConfig, error=QKStudyError, check=check_config, needs=("model", "data", "geometry")
)
def evaluate(cfg, ctx) -> dict:
    """Per layer, head and rotary pair: q/k statistics, score profiles, locality, and the conjecture's claims."""
    documents = ctx.documents(count=cfg.document + 1)
    longest = max((len(d.ids) for d in documents), default=0)
    if cfg.document >= len(documents):
        raise QKStudyError(
            f"eval.document={cfg.document} but the data has {len(documents)} documents (0..{len(documents) - 1})"
        )
    doc = documents[cfg.document]
    if cfg.tokens > len(doc.ids):
        raise QKStudyError(
            f"eval.tokens={cfg.tokens} exceeds document {cfg.document} ({doc.name}: {len(doc.ids)} tokens; "
            f"the longest has {longest}); use fewer tokens or another eval.document"
        )
    trained = ctx.trained_context
    max_distance = cfg.max_distance or 2 * trained
    compare = _resolve_compare(cfg, ctx.job)
    model = ctx.model()
    slots = ctx.job.model.slots  # found and selected once, when the job was parsed
    scaled = set(ctx.job.scaled or ())  # None: scaling=none patches nothing
    ids = doc.ids[: cfg.tokens].to(next(model.parameters()).device)[None]
    layers, ablation = capture_layers(model, ids, cfg, ctx.scaling, scaled, trained, max_distance)
    heads = [row for layer in layers for row in layer.heads]
    title = f"{ctx.title}, {cfg.tokens} tokens of {doc.name}"

    found = claims(heads)
    tables = {
        "layers": layer_rows(layers, trained),
        "strategies": strategy_rows(layers, ctx.scaling, compare, scaled, slots, max_distance),
        "dimensions": dimension_rows(layers, ctx.scaling, trained, max_distance),
    }
    write_outputs(ctx.output, cfg, layers, heads, tables, title, trained, max_distance, ctx.scaling.label)
    summary = summarize(heads, found, tables["layers"], tables["strategies"])
    ctx.output.metrics(
        "qk_study",
        {
            "claims": found,
            "layers": tables["layers"],
            "tokens": cfg.tokens,
            "document": doc.name,
            "max_distance": max_distance,
            "ablation": ablation,
            **summary,
        },
    )
    return summary
