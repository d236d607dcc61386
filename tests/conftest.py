"""Shared test set-up, as fixtures: the Hydra config composed as the CLI composes it (once per session for each
set of overrides, a copy for each test: the lightning-hydra-template pattern), jobs run through run.run(cfg) or
the CLI, the tiny models of tests/tiny.py, a plugin from outside the package, and real eval contexts built from
real jobs. What module-level code needs (ROOT, TINY, MICRO) is in tests/tiny.py."""

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf

from evals import load_evals
from evals.core.config.store import config_dir, register_configs
from evals.core.inputs.data import Document
from evals.core.job.parse import parse_job
from evals.core.inputs.model_cache import ModelCache
from evals.core.run.runner import started
from tests import tiny
from tests.tiny import MICRO, ROOT, TINY

os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TQDM_DISABLE", "1")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: heavier tests (real SmolLM2 runs, multi-process sweeps, memory-limit runs); CI runs them after the default suite",
    )


# --- composing and running jobs -----------------------------------------------------------------------------


# CI's rotation of the slow set (issue #65): the default suite runs whole on every landing; the slow tests, by file,
# are cut in two halves of about equal measured time (SLOW_HALF_B below; every other file is half A), and CI runs one
# half a landing: .ci/run sets ROPE_EXT_SLOW_HALF from the parity of main's commit count (`make ci-half` says which),
# so each slow test runs at least every second landing as long as landings alternate parity. No test is ever skipped
# for time: the other half is deselected, and the summary names its files. Unset: every slow test runs (make test-slow).
# The slow tests marked ``slow(ci_first=True)`` (the README's main job) run first in their half.
SLOW_HALF = os.environ.get("ROPE_EXT_SLOW_HALF", "").upper()  # "A", "B" or "" (both)
SLOW_HALF_B = frozenset(  # balanced on the durations of a whole run (`pytest --durations=0`, 2026-12-07)
    {
        "test_attention_families.py",
        "test_cache_paths.py",
        "test_config.py",
        "test_config_store.py",
        "test_engines.py",
        "test_files.py",
        "test_llama_cpp.py",
        "test_lm_harness.py",
        "test_positions.py",
        "test_qwen25.py",
        "test_refusals.py",
        "test_run.py",
        "test_search.py",
        "test_serve.py",
        "test_sweeps.py",
        "test_targets.py",
    }
)


def slow_half(path) -> str:
    """The half of the slow set a test file's slow tests belong to: "A" or "B"."""
    return "B" if Path(path).name in SLOW_HALF_B else "A"


def slow_files() -> list[Path]:
    """The test files holding slow tests (read as text: the xdist controller collects nothing itself)."""
    return sorted(path for path in Path(__file__).parent.glob("test_*.py") if "mark.slow" in path.read_text())


def pytest_collection_modifyitems(config, items):
    if SLOW_HALF:
        other = {item for item in items if item.get_closest_marker("slow") and slow_half(item.path) != SLOW_HALF}
        if other:
            config.hook.pytest_deselected(items=sorted(other, key=items.index))
            items[:] = [item for item in items if item not in other]
    first = [item for item in items if (mark := item.get_closest_marker("slow")) and mark.kwargs.get("ci_first")]
    items[:] = first + [item for item in items if item not in first]  # pytest-xdist hands out files in this order


def pytest_terminal_summary(terminalreporter, config):
    if SLOW_HALF and config.getoption("markexpr", "") != "not slow":
        ran = [path.name for path in slow_files() if slow_half(path) == SLOW_HALF]
        left = [path.name for path in slow_files() if slow_half(path) != SLOW_HALF]
        terminalreporter.write_line(f"slow rotation: half {SLOW_HALF} ran, the slow tests of {', '.join(ran)}")
        terminalreporter.write_line(
            f"slow rotation: not run this landing (the other half, run at the next landing): the slow tests of "
            f"{', '.join(left)}",
            yellow=True,
        )


def registration() -> tuple:
    """What evals.core.config.store.register_configs stores from -- the strategies (their parameters and whether
    built in), the evals, the options' YAMLs -- and the nodes the ConfigStore holds now (each store makes new ones,
    so a test that registers, or stores, anything changes it)."""
    from hydra.core.config_store import ConfigStore

    from evals import EVALS
    from evals.core.config.store import written_options
    from rope_ext import STRATEGIES

    def nodes(tree: dict) -> tuple:
        return tuple((k, nodes(v) if isinstance(v, dict) else id(v)) for k, v in tree.items())

    return (
        tuple((n, id(s), id(s.fn), s.fn.__module__, repr(s.params), repr(s.targets)) for n, s in STRATEGIES.items()),
        tuple((n, id(e), id(e.config), id(e.run), e.run.__module__) for n, e in EVALS.items()),
        tuple(sorted(written_options("scaling"))),
        tuple(sorted(written_options("eval"))),
        nodes(ConfigStore.instance().repo),
    )


@pytest.fixture(scope="session")
def compose():
    """``compose(*overrides, searchpath=None, return_hydra_config=False)``: the config ``python run.py <overrides>``
    composes. Each distinct call is composed once per session; every call gets its own deep copy, so a test may
    change its config (parsing a job resolves the eval's lengths in place) without touching another's."""
    composed, registered = {}, [None]

    def compose(*overrides, searchpath: list[str] | None = None, return_hydra_config: bool = False):
        key = (overrides, tuple(searchpath or ()), return_hydra_config)
        if key not in composed:
            load_evals()
            if registered[0] != registration():  # storing the options is ~0.3 s: only when what they come from changed
                register_configs()
                registered[0] = registration()
            extra = [f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else []
            with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
                composed[key] = hydra_compose(
                    "config", overrides=[*extra, *overrides], return_hydra_config=return_hydra_config
                )
        return copy.deepcopy(composed[key])

    return compose


@pytest.fixture(scope="session")
def run_job(compose):
    """``run_job(out_dir, *overrides)``: one job on the TINY model through run.run(cfg), forced: (summary,
    results.json). The unscaled reference is not run first (``verdict.baseline=false``) unless a test asks for it:
    most tests are not about the verdict."""
    import run as rope_run

    def run_job(out_dir, *overrides):
        cfg = compose(*TINY, "force=true", "verdict.baseline=false", f"output_dir={out_dir}", *overrides)
        summary = rope_run.run(cfg)
        return summary, json.loads((Path(out_dir) / "results.json").read_text())

    return run_job


@pytest.fixture(scope="session")
def run_cli():
    """``run_cli(*args, env=None, timeout=300, **popen)``: ``python run.py <args>`` in a subprocess, in the checkout:
    the CompletedProcess (output captured as text), or the running Popen when given ``popen`` arguments."""

    def run_cli(*args, env=None, timeout=300, **popen):
        command = [sys.executable, str(ROOT / "run.py"), *args]
        if popen:
            return subprocess.Popen(command, cwd=ROOT, env=env, **popen)
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)

    return run_cli


@pytest.fixture(scope="session")
def interrupted_run(run_cli):
    """``interrupted_run(records, *args)``: ``python run.py <args>`` sent SIGTERM once ``records`` (a JSONL file the
    job writes) holds a finished line; it must exit 130 without a traceback. Returns the records kept."""

    def interrupted_run(records, *args):
        process = run_cli(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 240
        while not (records.is_file() and records.read_text().count("\n") >= 1) and time.time() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 130 and "Traceback" not in stderr, stderr[-2000:]
        return [json.loads(line) for line in records.read_text().splitlines()]

    return interrupted_run


@pytest.fixture(scope="session")
def searchpath():
    """``searchpath(directory)``: the override that puts ``directory/conf`` on Hydra's search path."""
    return lambda directory: f"hydra.searchpath=[file://{Path(directory) / 'conf'}]"


@pytest.fixture(scope="session")
def structured():
    """``structured(schema, **values)``: an eval config as composition makes it, the registered schema, typed,
    with ``values`` set."""
    return lambda schema, **values: OmegaConf.structured(schema(**values))


# --- models -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_llama():
    """``tiny_llama(vocab=96, trained=64, seed=0, **extra)``: the micro Llama of tests/tiny.py, built directly."""
    return tiny.tiny_llama


@pytest.fixture(scope="session")
def real_model(tmp_path_factory, compose):
    """``real_model(*overrides)``: (the job those overrides make, its model loaded into the runner's cache); the runs
    of a test module then reuse the model (re-patched, not reloaded)."""
    from evals.core.inputs.model_cache import MODEL_CACHE

    def load(*overrides):
        job = parse_job(compose(*overrides), tmp_path_factory.mktemp("real") / "job")
        return job, MODEL_CACHE.get(job.model)[0]

    return load


@pytest.fixture
def models(tmp_path, searchpath):
    """The override that finds the YAML models of tests/tiny.py (tinygemma: Gemma-3's per-layer-type RoPE;
    tinyqwen2: q/k/v biases; tinygpt2: no RoPE; tinyneoxjapanese: attention that cannot be
    hooked), written to a conf
    dir in ``tmp_path``."""
    (tmp_path / "conf" / "model").mkdir(parents=True, exist_ok=True)
    for name, model in tiny.MODELS.items():
        (tmp_path / "conf" / "model" / f"{name}.yaml").write_text(OmegaConf.to_yaml(model))
    return searchpath(tmp_path)


# --- a plugin from outside the package ----------------------------------------------------------------------

PLUGIN = '''
"""Strategies and evals from outside rope_ext, one function each (and test-only behaviours)."""
import os
import resource
import time
from dataclasses import dataclass

import torch

import rope_ext
from evals import Measurement, Metric, register_eval, token_blocks
from evals.core.config import lengths, option
from evals.core.scoring.nll import token_nll

if os.environ.get("TEST_MEMORY_LIMIT_GIB"):  # a process memory limit, so an allocation fails without harm
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = size + int(float(os.environ["TEST_MEMORY_LIMIT_GIB"]) * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@rope_ext.register("halve_slow", params={"factor": rope_ext.Param(2.0, float, "slow pairs / factor", minimum=1.0)})
def halve_slow(p, dim, base, seq_len):
    """The slower half of the pairs interpolated by factor, the faster half kept."""
    factors = torch.ones(dim // 2)
    factors[dim // 4 :] = p["factor"]
    return rope_ext.default_inv_freq(dim, base) / factors, 1.0


@dataclass
class FirstTokensConfig:
    name: str = "first_tokens"
    tokens: int = option(64, minimum=2)
    sleep: float = 0.0  # seconds to wait after scoring (to interrupt a running job)
    crash: bool = False  # raise an error that is not a user error (a bug)


@register_eval("first_tokens", config=FirstTokensConfig, needs=("model", "data"))
def first_tokens(cfg, ctx):
    """Mean NLL of the first tokens of the first document."""
    ids = ctx.documents()[0].ids[: cfg.tokens]
    nll = token_nll(ctx.model(), ids)
    ctx.output.table("first_tokens", [{"position": i + 1, "nll": float(v)} for i, v in enumerate(nll)])
    if cfg.crash:
        raise RuntimeError("boom: a bug in an eval")
    time.sleep(cfg.sleep)
    return {"first_tokens_nll": float(nll.mean())}


@dataclass
class PrefixNllConfig:
    name: str = "prefix_nll"
    lengths: list = lengths([32, "1x", "2x"])


def prefix_nll_figures(name, jobs, label):
    """Its section of the report: one bar per run, the NLL at its longest length."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    values = {label(j): max(((int(k.split("@")[1]), v) for k, v in j["summary"].items() if k.startswith(name + "@")))[1]
              for j in jobs if j.get("job", {}).get("eval") == name}
    ax.bar(list(values), list(values.values()))
    return {f"{name}_bars": fig} if values else {}


@register_eval("prefix_nll", config=PrefixNllConfig, report=prefix_nll_figures,
               metrics=(Metric("prefix_nll", lower_is_better=True, verdict=True, label="prefix NLL", nll=True),))
def prefix_nll(cfg, ctx):
    """Mean NLL of the first L tokens of the first document, per length L, over 8-token blocks."""
    doc = ctx.documents()[0]
    for L in cfg.lengths:
        nll = token_nll(ctx.model(), doc.ids[:L])
        ctx.output.measure(Measurement("prefix_nll", L, float(nll.mean()), len(nll), "8-token block",
                                       token_blocks(doc.name, nll, torch.arange(1, L), 8)))
    return {}
'''


@pytest.fixture
def plugin(tmp_path):
    """(dir, env): the plugin module and its two YAMLs in a temp dir (nothing of the project touched), and the
    environment that loads it (``ROPE_EXT_PLUGINS``); pass ``searchpath(dir)`` to the CLI."""
    (tmp_path / "my_ext.py").write_text(PLUGIN)
    (tmp_path / "conf" / "scaling").mkdir(parents=True)
    (tmp_path / "conf" / "eval").mkdir()
    (tmp_path / "conf" / "scaling" / "halve_slow.yaml").write_text(
        "defaults:\n  - /schema/scaling@_here_: halve_slow\n  - _self_\n"
    )
    for name in ("first_tokens", "prefix_nll"):
        (tmp_path / "conf" / "eval" / f"{name}.yaml").write_text(
            f"defaults:\n  - /schema/eval@_here_: {name}\n  - _self_\n"
        )
    env = {**os.environ, "ROPE_EXT_PLUGINS": "my_ext", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return tmp_path, env


# --- real eval contexts -------------------------------------------------------------------------------------


def scaling_overrides(scaling: dict | None) -> list[str]:
    """{"name": "yarn", "factor": 4.0} -> ["scaling=yarn", "scaling.factor=4.0"]."""
    scaling = dict(scaling or {"name": "none"})
    name = scaling.pop("name")
    return [f"scaling={name}"] + [f"scaling.{k}={json.dumps(v)}" for k, v in scaling.items()]


@pytest.fixture
def documents():
    """Three documents of random ids in the micro model's vocabulary (300, 260 and 150 tokens)."""
    generator = torch.Generator().manual_seed(0)
    return [Document(f"doc{i}", torch.randint(3, 96, (n,), generator=generator)) for i, n in enumerate([300, 260, 150])]


def direct_metrics() -> dict:
    """The metrics perplexity (with LongPPL), needle and passkey (both scorings) declare, as results.json records them."""
    from omegaconf import OmegaConf

    from evals import EVALS, load_evals

    load_evals()
    found = {}
    for name, values in (
        ("perplexity", {"longppl": True}),
        ("needle", {"name": "needle"}),
        ("passkey", {"name": "passkey"}),
    ):
        spec = EVALS[name]
        cfg = OmegaConf.merge(OmegaConf.structured(spec.config), values)
        found.update({m.name: m.declared(name) for m in spec.metrics_for(cfg)})
    return found


@pytest.fixture
def eval_context(tmp_path, documents, compose):
    """``make(scaling, *overrides, docs=...)``: a real EvalContext of a real job on the MICRO model (vocabulary 96
    unless overridden), with the given documents in place of the job's data."""
    stack, count = contextlib.ExitStack(), [0]

    def make(scaling=None, *overrides, docs=None):
        count[0] += 1
        cfg = compose(*MICRO, "model.architecture.vocab_size=96", *scaling_overrides(scaling), *overrides)
        job = parse_job(cfg, tmp_path / f"run{count[0]}")
        job.out_dir.mkdir(parents=True)
        ctx = stack.enter_context(started(job, job.out_dir, ModelCache(), documents=docs or documents))
        ctx.output.declare(direct_metrics())  # the tests call an eval's function with a config of their own
        return ctx

    with stack:
        yield make
