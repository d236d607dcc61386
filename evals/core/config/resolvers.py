"""The OmegaConf resolvers the configs use, registered on import: ``${rope_ext.factor:...}`` (the ``_x2`` /
``_to4x`` suffix of run and sweep directory names, conf/hydra/default.yaml), ``${rope_ext.model_name:...}`` (the
model's name there: a local checkpoint's own) and ``${rope_ext.groups:}`` (the
config groups and their options, as ``--help`` lists them).
"""

from __future__ import annotations

from omegaconf import OmegaConf


def _factor_suffix(name, factor, target=None) -> str:
    """``_x2`` for a scaling factor of 2 (given, or the strategy's registered default), ``_to4x`` for target=4x
    (run and sweep directory names say what the scaling extends to); nothing for a strategy without a factor."""
    if target not in (None, "") and factor in (None, ""):
        return f"_to{target}"
    if factor in (None, ""):
        from rope_ext import ALIASES, STRATEGIES

        param = STRATEGIES.get(ALIASES.get(name, name))
        factor = param.params["factor"].default if param and "factor" in param.params and name != "none" else None
    return "" if factor in (None, "") else f"_x{float(factor):g}"


def _model_name(model) -> str:
    """The model's name in run and sweep directory names: a local checkpoint's own (``model.path``), not its
    preset's (:func:`evals.core.inputs.models.model_name`, the one rule)."""
    from ..inputs.models import model_name

    return model_name(model)


def _option_groups() -> str:
    """The config groups a user chooses from, with their options, as ``--help`` lists them (Hydra's own and the
    internal ``schema/`` groups left out); groups on ``hydra.searchpath`` (plugins) included."""
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    groups = sorted(g for g in loader.list_groups("") if g not in ("hydra", "schema"))
    return "\n".join(f"{g}: {', '.join(sorted(loader.get_group_options(g)))}" for g in groups)


OmegaConf.register_new_resolver("rope_ext.factor", _factor_suffix, replace=True)
OmegaConf.register_new_resolver("rope_ext.model_name", _model_name, replace=True)
OmegaConf.register_new_resolver("rope_ext.groups", _option_groups, replace=True)
