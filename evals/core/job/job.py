"""A job, parsed and validated once: :func:`evals.core.job.parse.parse_job` turns the composed Hydra config into
the frozen :class:`Job` here that everything downstream takes as it is; :func:`parts` names the evals a job
runs (the eval itself, or a suite's members), :func:`with_eval` the same job running one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import rope_ext
from omegaconf import OmegaConf

from ..config.lengths import length_fields
from ..inputs.models import ResolvedModel
from ..registry import EvalSpec


@dataclass(frozen=True)
class Job:
    name: str  # <model>-<scaling label>-<eval>: the W&B run name
    model: ResolvedModel
    scaling: rope_ext.Scaling
    scaled: (
        tuple[rope_ext.RotarySlot, ...] | None
    )  # the slots the scaling patches, selected once (None: geometry not read)
    eval: EvalSpec
    eval_cfg: Any
    data_cfg: Any
    seed: int
    config: dict  # the resolved config (results.json, W&B)
    identity: dict  # everything that changes a number
    key: str
    out_dir: Path
    logger: Any
    force: bool
    resume_from: tuple[str, ...]
    multirun: bool = False
    verdict: Any = None  # how results are judged (verdict.tolerance, .retained, .baseline): not in the key
    target: int | None = (
        None  # the length the question is about (target=; verdict.target; trained x factor; the longest)
    )
    derived: dict = field(default_factory=dict)  # {scaling parameter: (value, why)} set up for target=
    compare: dict = field(default_factory=dict)  # {eval: its comparison key} -- what must match a reference's
    compare_fields: dict = field(default_factory=dict)  # {eval: the compared fields}, to say what differs
    environment: str = ""  # versions and code: results of another environment are compared with a warning
    reference: "Job | None" = None  # the unscaled job to run first when no finished reference is found
    role: str = "job"  # "reference": run as another job's unscaled reference

    @property
    def trained_context(self) -> int:
        return self.model.trained_context

    def info(self) -> dict:
        """The job as results.json and the report name it."""
        return {
            "name": self.name,
            "key": self.key,
            "model": self.model.name,
            "model_label": self.model.label,
            **({"model_family": self.model.family} if self.model.family != self.model.name else {}),
            "weights": self.model.cfg.weights,
            "scaling": self.scaling.label,
            "eval": self.eval.name,
            "data": self.data_cfg.name,
            "trained_context": self.trained_context,
            "target_length": self.target,
            "compare": self.compare,
            "environment": self.environment,
            "role": self.role,
        }

    def sections(self) -> dict:
        """What results.json records of the job before anything runs."""
        return {
            "job": self.info(),
            "config": self.config,
            "identity": self.identity,
            "compare": self.compare_fields,
            "declared": self.declared(),
        }

    def declared(self) -> dict:
        """The per-length metrics its evals declare, as results.json records them."""
        return {
            m.name: m.declared(spec.name)
            for spec, part in self.eval.parts_of(self.eval_cfg)
            for m in spec.metrics_for(part)
        }

    def needs_reference(self) -> bool:
        """Whether the verdict judges anything this job measures: a metric declared with ``verdict``, or an eval
        with lengths whose metrics are known only when it runs (lm-eval's tasks)."""
        return any(m["verdict"] for m in self.declared().values()) or any(
            length_fields(spec.config) and not spec.metrics_for(part)
            for spec, part in self.eval.parts_of(self.eval_cfg)
        )


def container(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def parts(spec: EvalSpec, cfg, path: str = "eval") -> list[tuple[EvalSpec, Any, str]]:
    """(eval, its config node, its config path) of every eval the job runs: the eval itself, or a suite's members."""
    if spec.parts is None:
        return [(spec, cfg, path)]
    return [(part_spec, part, f"{path}.{part_spec.name}") for part_spec, part in spec.parts_of(cfg)]


def with_eval(job: Job, spec: EvalSpec, cfg) -> Job:
    """The same job running another eval of a suite (same model, scaling, data, output)."""
    return replace(job, eval=spec, eval_cfg=cfg)
