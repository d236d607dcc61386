#!/usr/bin/env bash
# Issue #34's measurement on SmolLM2 at 2x its trained context (16384): perplexity on the first 16k tokens of all
# six novels (prefix; one 16k pass per document gives 4096 and 8192 too) and passkey at 8192 and 16384 on 30
# prompts (depths 0.05-0.85 x 6 trials, the fewest issue #44 asks of a retrieval row: spread, so that keys lie up to
# ~15.5k tokens back -- late needles would cost less with prefix sharing, but would only test distances the model was
# trained on), every verdict paired against the unscaled model; then the merged report's ranked answer. Steps in
# order of what the answer needs most; each finds the finished jobs of an earlier run (resume_from), so the script
# can be stopped and started again.
#   bash bench/trust_smollm2.sh [step ...]   steps: ppl_core passkey_core ppl_yarn ppl_rest (= ppl_string ppl_se) passkey_rest report
# DRY_RUN=1 prints each command (one line, shell-quoted) instead of running it (tests/test_bench.py composes them).
set -euo pipefail
cd "$(dirname "$0")/.."
timed() { if [[ -n ${DRY_RUN:-} ]]; then printf '%q ' "$@" && echo; else /usr/bin/time -v "$@"; fi; }
PY=${PY:-.venv/bin/python}
OUT=${OUT:-multirun/trust}
P="eval=perplexity eval.lengths=[4096,8192,16384] eval.documents=null logger=none"
K="eval=passkey eval.lengths=[8192,16384] eval.depths=[0.05,0.25,0.45,0.65,0.85] eval.trials=6 logger=none"
SE="scaling=self_extend scaling.group_size=4 scaling.window=1024"   # G, W by the paper's rule for 16k on an 8k model
ALL="[$OUT/ppl,$OUT/ppl_rest,$OUT/passkey,$OUT/passkey_rest]"
steps=${*:-ppl_core passkey_core ppl_yarn ppl_rest passkey_rest report}
for step in $steps; do
  echo "== $step $(date -u +%H:%M:%S)"
  case $step in
    ppl_core) timed $PY run.py -m scaling=none,dca,lm_infinite $P hydra.sweep.dir=$OUT/ppl resume_from=$ALL ;;
    ppl_yarn) timed $PY run.py -m scaling=yarn $P hydra.sweep.dir=$OUT/ppl_rest/yarn resume_from=$ALL ;;
    passkey_core) timed $PY run.py -m scaling=lm_infinite,dca $K hydra.sweep.dir=$OUT/passkey resume_from=$ALL ;;
    ppl_se)
      timed $PY run.py -m $SE $P hydra.sweep.dir=$OUT/ppl_rest/self_extend resume_from=$ALL ;;
    ppl_string)
      timed $PY run.py -m scaling=string $P hydra.sweep.dir=$OUT/ppl_rest resume_from=$ALL ;;
    ppl_rest)
      timed $PY run.py -m scaling=string $P hydra.sweep.dir=$OUT/ppl_rest resume_from=$ALL
      timed $PY run.py -m $SE $P hydra.sweep.dir=$OUT/ppl_rest/self_extend resume_from=$ALL ;;
    passkey_rest)
      timed $PY run.py -m scaling=yarn $K hydra.sweep.dir=$OUT/passkey_rest resume_from=$ALL
      timed $PY run.py -m $SE $K hydra.sweep.dir=$OUT/passkey_rest/self_extend resume_from=$ALL ;;
    report) timed $PY -m evals.report $OUT/ppl $OUT/ppl_rest $OUT/passkey $OUT/passkey_rest --out $OUT ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
