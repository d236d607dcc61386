"""The rope_ext command line, one Hydra app behind ``python run.py ...`` and the ``rope-ext`` console script.

Composition errors (a misspelled key, an unknown option, a value of the wrong type, a parameter the
chosen strategy does not take) are one line and exit 2, like every other bad input; a multirun exits
non-zero when any of its jobs failed (see :class:`evals.report.ReportCallback`); Ctrl-C or SIGTERM is one
line and exit 130, the run recorded as interrupted -- wherever it lands, also where a library turns it into
another error or swallows it (see :mod:`evals.core.run.interrupt`).
"""

from __future__ import annotations

import os
import sys

import hydra

from .core.run import interrupt
from .core.config.store import config_dir, register_configs
from .core.errors import UserError
from .core.progress import quiet_libraries
from .core.run.runner import run_hydra


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def app(cfg) -> dict | None:
    return run_hydra(cfg)  # the summary: what a sweeper (hydra/sweeper=optuna) reads a trial's objective from


def composition_error(err: BaseException) -> str:
    """One line from a Hydra/OmegaConf composition error, naming the key and what is valid.

    Read from the exceptions, not their text, where they say it: a key the schema does not have is OmegaConf's
    ConfigAttributeError/ConfigKeyError (``key``, ``full_key``, ``object_type``) behind Hydra's error; an unknown
    option of a group is Hydra's MissingConfigException (``missing_cfg_file``, ``options``). Anything else is Hydra's
    own text joined into one line, less the lines that only repeat the key or suggest ``+key=``: its wording, and
    each shape above, are pinned for the installed Hydra by tests/test_composition_errors.py."""
    import difflib

    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    from rope_ext import STRATEGIES

    from .core.config.fields import not_an_option
    from .core.config.schemas import scaling_schema_name

    cause = err.__cause__ or err.__context__
    key, schema = getattr(cause, "key", None), getattr(cause, "object_type", None)
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and key is not None and isinstance(schema, type):
        fields = [f for f in getattr(schema, "__dataclass_fields__", {}) if f not in ("name", "defaults")]
        strategy = next((s for s in STRATEGIES.values() if schema.__name__ == scaling_schema_name(s.name)), None)
        if strategy is not None:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            return f"scaling '{strategy.name}' does not take {key}. Its parameters: {', '.join(fields)}.{hint}"
        if not fields:
            return f"{cause.full_key} is not in the config; to add a key there, write +{cause.full_key}=..."
        return not_an_option(cause.full_key, key, schema)
    override = getattr(err, "override", None)  # Hydra's OverrideParseException: the override it could not parse
    if isinstance(err, OverrideParseException) and override and any(c in override for c in "<>"):
        key = override.split("=", 1)[0]
        example = (
            "'constraints=[\"ppl_retention@4096>=0.98\"]'"
            if key == "constraints"
            else f"'{key}=\"...\"' (in a list: '{key}=[\"...\"]')"
        )
        return (
            f"{override}: Hydra's override grammar does not take '<' or '>' unquoted; quote the string that holds it, "
            f"e.g. {example}, the outer quotes for the shell"
        )
    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file:  # an unknown option
        group, _, wanted = err.missing_cfg_file.rpartition("/")
        names = list(err.options)
        close = difflib.get_close_matches(wanted, names, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        return f"{group}={wanted} is not an option; available: {', '.join(names)}.{hint}"
    text = str(err)
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith(("To append", "full_key", "object_type", "reference_type"))
    ]
    if cause is not None and str(cause).strip():
        lines.append(str(cause).splitlines()[0])
    return " ".join(dict.fromkeys(lines))


def main() -> int:
    """Entry point: run the Hydra app and turn its composition errors into one line and exit 2; output piped into
    a reader that stops early (``| head``) ends quietly."""
    from . import load_evals

    os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # composition errors reach us, not Hydra's multi-line printer
    interrupt.install()
    quiet_libraries()
    load_evals()
    register_configs()
    try:
        return _main()
    except BrokenPipeError:  # `rope-ext --help | head`: the reader has what it wanted; no traceback
        _stdout_to_devnull()
        return 0


def _stdout_to_devnull() -> None:
    """What Python's docs advise after a BrokenPipeError: stdout pointed at /dev/null, so that the interpreter's
    own flush at exit does not fail again ("Exception ignored ... BrokenPipeError")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _main() -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        shown = _help(sys.argv[1:])
        if shown is not None:
            print(shown, flush=True)
            return 0
        _one_mode(sys.argv[1:])
        for line in _sweep_preflight(sys.argv[1:]):
            print(line, flush=True)
        app()
        shown = _derived_for_cfg(sys.argv[1:])
        if shown:
            print(
                "\n".join(
                    [
                        "# set up for the target (derived when the job runs; an explicit scaling.<key>= wins):",
                        *[f"# {line}" for line in shown],
                    ]
                )
            )
        sys.stdout.flush()  # a closed pipe is found here, not in the interpreter's flush at exit
    except BrokenPipeError:
        raise
    except BaseException as err:  # the interrupt first: a library may have raised it as any other type
        if interrupt.interrupted(err):
            print("interrupted: the run is recorded as interrupted in its results.json", file=sys.stderr)
            return 130
        if isinstance(err, (HydraException, OmegaConfBaseException)):
            print(f"error: {composition_error(err)}", file=sys.stderr)
            return 2
        if isinstance(err, UserError):  # bad input a sweeper found before any trial ran (evals/search)
            print(f"error: {err}", file=sys.stderr)
            return 2
        if not (isinstance(err, OSError) and _making_hydra_dir(err)):
            raise
        print(
            f"error: the run directory {err.filename} cannot be created ({err.strerror or type(err).__name__}); "
            f"choose a writable hydra.run.dir (hydra.sweep.dir with -m)",
            file=sys.stderr,
        )
        return 2
    return 0


def _help(argv: list[str]) -> str | None:
    """``--help`` rendered as Hydra renders it -- ``hydra.help.template`` with the composed job config as
    ``$CONFIG`` -- without what our template does not show: Hydra lists every config group for
    ``$APP_CONFIG_GROUPS`` and ``$HYDRA_CONFIG_GROUPS`` whether the template shows them or not, copying the whole
    config store for each group (seconds). None -- Hydra renders it -- when it is not ``--help`` or when the template
    (a user's) shows those or ``$FLAGS_HELP``."""
    import copy
    import string

    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    args = get_args_parser().parse_args(argv)
    if not args.help or args.hydra_help or args.config_dir or args.config_name or args.config_path:
        return None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            cfg = compose("config", overrides=args.overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            template = str(cfg.hydra.help.template)
            if any(f"${name}" in template for name in ("FLAGS_HELP", "APP_CONFIG_GROUPS", "HYDRA_CONFIG_GROUPS")):
                return None
            job = copy.deepcopy(cfg)
            with open_dict(job):
                del job["hydra"]
            return string.Template(template).substitute(CONFIG=OmegaConf.to_yaml(job, resolve=args.resolve))
    except Exception:  # noqa: BLE001 -- anything else (a bad override, a $ of its own): Hydra renders and says it
        return None
    finally:
        GlobalHydra.instance().clear()


def _one_mode(argv: list[str]) -> None:
    """Hydra's own checks of its flags, as one line: it raises them as a bare ValueError, a traceback. ``-m`` with
    ``--cfg`` is what a user tries to see a sweep before running it; the line says how."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    flags = {
        "--run": args.run,
        "-m": args.multirun,
        "--cfg": args.cfg is not None,
        "--info": args.info is not None,
        "--shell-completion": args.shell_completion,
    }
    given = [flag for flag, on in flags.items() if on]
    if len(given) > 1:
        raise UserError(
            f"{' and '.join(given)} together: Hydra takes one of --run, -m (--multirun), --cfg, --info and "
            "--shell-completion; to see a sweep without running it, leave out -m: --cfg hydra shows its swept values "
            "(hydra.sweeper.params), --cfg job one job's config"
        )
    if args.resolve and not (args.cfg or args.help):
        raise UserError("--resolve goes with --cfg or --help (it resolves the config they print)")
    presets = [o.split("=", 1)[1] for o in args.overrides if o.split("=", 1)[0].lstrip("+") == "experiment"]
    if not args.multirun and not given and presets:
        _sweep_preset_alone(presets[-1], args.overrides)


def _sweep_preset_alone(preset: str, overrides: list[str]) -> None:
    """An ``experiment`` preset that is a sweep (``hydra.sweeper.params``), run without ``-m``: Hydra ignores the
    sweep and runs one job (``experiment=compare``: the unscaled model alone, for hours on a CPU) -- refused."""
    from omegaconf import OmegaConf

    path = config_dir() / "experiment" / f"{preset}.yaml"
    if not path.is_file():
        return  # Hydra says the option does not exist
    swept = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params") or {}
    if not swept:
        return
    what = "; ".join(f"{key} over {value}" for key, value in swept.items())
    raise UserError(
        f"experiment={preset} is a sweep ({what}): run it with -m (python run.py -m {' '.join(overrides)}); "
        "without -m Hydra runs one job of it and sweeps nothing"
    )


def _sweep_preflight(argv: list[str]) -> list[str]:
    """Before a sweep (``-m``, not a search) for a target (``target=`` or ``experiment=compare``) starts: its first
    job's config composed, checked and its budget said (:func:`evals.report.target_preflight`); raises a UserError
    for what would fail every job. Any sweep it cannot compose alone (Hydra's range()/choice()/glob(), a user config
    dir) is left to Hydra, unchecked here."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = get_args_parser().parse_args(argv)
    keys = [o.split("=", 1)[0] for o in args.overrides]
    wanted = "target" in keys or "experiment=compare" in args.overrides
    if not args.multirun or args.cfg or not wanted or args.config_dir or args.config_name or "hydra/sweeper" in keys:
        return []
    from .report.sweep import target_preflight

    try:
        parsed = OverridesParser.create().parse_overrides(args.overrides)
        first = []
        for override in parsed:
            if override.is_sweep_override():
                value = next(iter(override.sweep_string_iterator()))
                first.append(f"{override.get_key_element()}={value}")
            else:
                first.append(override.input_line)
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            cfg = compose("config", overrides=first, return_hydra_config=True)
    except Exception:  # noqa: BLE001 -- not composable alone: Hydra composes and reports it as usual
        GlobalHydra.instance().clear()
        return []
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.hydra.overrides.task = list(args.overrides)
    GlobalHydra.instance().clear()
    return target_preflight(cfg)


def _derived_for_cfg(argv: list[str]) -> list[str]:
    """After ``--cfg job`` (or ``all``) printed the composed config of a single run: what ``target=`` derives there
    (:func:`evals.core.job.target.target_setup`), which Hydra cannot show since it is computed from the model."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    args = get_args_parser().parse_args(argv)
    if args.cfg not in ("job", "all") or args.multirun or not any(o.split("=")[0] == "target" for o in args.overrides):
        return []
    from .core.job.target import target_setup

    GlobalHydra.instance().clear()
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=args.overrides)
    return target_setup(cfg)


def _making_hydra_dir(err: OSError) -> bool:
    """Whether ``err`` is Hydra failing to create its run or sweep directory (before any job of ours ran)."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    in_hydra = any("/hydra/" in f.filename and f.name in ("run_job", "launch", "sweep", "run") for f in frames)
    ours = any("/evals/" in f.filename and f.name not in ("main", "_main", "app") for f in frames)
    return bool(err.filename) and in_hydra and not ours and frames[-1].name in ("mkdir", "makedirs")
