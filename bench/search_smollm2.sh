#!/usr/bin/env bash
# Issue #26's measurements (docs/benchmarks.md, "Searches on SmolLM2"): searches of SmolLM2 (trained 8192) to 16384
# against ppl@16384 on Emma with LongRoPE2's short guard (ppl_retention@4096 >= 0.98 vs the unscaled model), then
# the searched YaRN on what it was not searched on. About 3.5 h on a 2-core CPU (a 16k trial: 100-170 s); run it alone.
#   bash bench/search_smollm2.sh [yarn|ntk|mixed|mixed_ntk|mixed_yarn|cross] [out dir, default multirun/bench_search]
# DRY_RUN=1 prints each command (one line, shell-quoted) instead of running it (tests/test_bench.py composes them);
# a step that reads an earlier search's result prints it as <from ...>.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
what=${1:-all} out=${2:-multirun/bench_search}
py=(.venv/bin/python run.py)
common=(objective=ppl@16384 'constraints=["ppl_retention@4096>=0.98"]' 'eval.lengths=[4096,16384]' logger=wandb logger.mode=offline)
run() { if [[ -n ${DRY_RUN:-} ]]; then printf '%q ' "$@" && echo; else "$@"; fi; }
search() { if [[ -n ${DRY_RUN:-} ]]; then run "${py[@]}" -m hydra/sweeper=optuna "${common[@]}" "$@"; else /usr/bin/time -v "${py[@]}" -m hydra/sweeper=optuna "${common[@]}" "$@"; fi; }
if [[ $what == all || $what == yarn ]]; then  # 30 trials, the published default first, factor [1, 4] for a 2x target
  search scaling=yarn hydra.sweeper.n_trials=30 'scaling.factor=tag(log,interval(1,4))' \
    'hydra.sweeper.enqueue=[{scaling.factor:2.0,scaling.beta_fast:32.0,scaling.beta_slow:1.0,scaling.attention_factor:1.0693147}]' \
    hydra.sweep.dir="$out/yarn"
fi
if [[ $what == all || $what == ntk ]]; then  # 30 trials, the published default first
  search scaling=ntk_by_parts hydra.sweeper.n_trials=30 'scaling.factor=tag(log,interval(1,4))' \
    'hydra.sweeper.enqueue=[{scaling.factor:2.0,scaling.beta_fast:32.0,scaling.beta_slow:1.0}]' hydra.sweep.dir="$out/ntk_by_parts"
fi
if [[ $what == all || $what == mixed ]]; then  # per-dimension factors (LongRoPE's constraints), a small budget
  search scaling=mixed scaling.bands=null hydra.sweeper.n_trials=6 hydra.sweep.dir="$out/mixed"
fi
if [[ $what == all || $what == mixed_ntk || $what == mixed_yarn ]]; then  # per-dimension factors from a searched shape
  # the searched NTK-by-parts' (or YaRN's) per-pair factors f_i = theta_i / theta'_i (SmolLM2: d = 64, base 1e5) as
  # the space's n_hat, top and steps (evals/search/space.py), enqueued as the first trial, with its attention factor
  from=$([[ $what == mixed_yarn ]] && echo yarn || echo ntk_by_parts)
  enqueue=$([[ -n ${DRY_RUN:-} ]] && echo "<from $out/$from/search.json>" || .venv/bin/python - "$out/$from/search.json" <<'PY'
import json, sys
import rope_ext
from evals.search.space import monotone_steps
found = json.load(open(sys.argv[1]))
s = {"name": found["strategy"], "original_max_position": 8192, **found["best"][0]["scaling"]}
theta, attention = rope_ext.frequencies(s, 64, 100000.0)
n_hat, top, steps = monotone_steps((rope_ext.default_inv_freq(64, 100000.0) / theta).tolist())
items = [f"scaling.factors.n_hat:{n_hat}", f"scaling.factors.top:{top!r}"]
items += [f"scaling.factors.x{i:02d}:{x:.10f}" for i, x in enumerate(steps)]
print("hydra.sweeper.enqueue=[{" + ",".join(items + [f"scaling.attention_factor:{attention}"]) + "}]")
PY
)
  search scaling=mixed scaling.bands=null hydra.sweeper.n_trials=6 "$enqueue" hydra.sweep.dir="$out/mixed_from_$from"
fi
if [[ $what == all || $what == cross ]]; then  # the published and the searched YaRN on needle, passkey, another book
  searched="hydra.searchpath=[file://$(realpath -m "$out/yarn/conf")]"
  for setting in "default scaling=yarn scaling.factor=2" "searched $searched scaling=yarn_searched" "none scaling=none"; do
    read -r name args <<<"$setting"
    for eval in needle passkey; do
      run "${py[@]}" eval=$eval eval.lengths=[16384] 'eval.depths=[0.1,0.5,0.9]' eval.trials=1 logger=none \
        verdict.baseline=false $args hydra.run.dir="$out/cross/${name}_$eval"
    done
    run "${py[@]}" eval=perplexity 'data.books=[persuasion]' 'eval.lengths=[4096,8192,16384]' logger=none $args \
      hydra.run.dir="$out/cross/${name}_persuasion"
  done
fi
