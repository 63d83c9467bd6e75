#!/usr/bin/env bash
# Full-scale CIFAR-10 reproduction cells on a lent GPU, in about 10 minutes (a GPU is never required):
#   1. CELM Table 1, CIFAR-10 Dir(0.05): FedAvg and CELM, 1 seed, the paper's 200 rounds (two cells at once);
#   2. ProxyFL Table 1, CIFAR-10 alpha = 0.1: ProxyFL at the paper's scale but 10 of its 300 rounds.
# Each writes the same result page `fedhet reproduce --page` writes (table, command, scale, commit, figures).
#
#   benchmarks/gpu_reproduce.sh [OUT_DIR]         # default OUT_DIR: build/gpu-reproduce
#
# Pages land in OUT_DIR/results/ (copy them to docs/results/ to publish), runs in OUT_DIR/runs/, logs beside.
# Environment: PYTHON (default .venv/bin/python, else python3), SCALE=full|tiny (tiny: the quick scale on the
# CPU, to test this script), FEDHET_DATA=a folder holding cifar10-jpg.tar.gz (else the shared copy).
# Test it on a CPU with:  SCALE=tiny benchmarks/gpu_reproduce.sh /tmp/gpu-reproduce
set -uo pipefail
DEFAULT_OUT=build/gpu-reproduce
# shellcheck source=benchmarks/gpu_env.sh
source "$(dirname "$0")/gpu_env.sh"
mkdir -p "$OUT/results"
if [ "$SCALE" = tiny ]; then
  scale=quick; device=cpu; celm_limit=300; proxy_limit=300
  proxy_cut=(--set model.params.width=8 --set train.batch_size=16 --set method.params.gpt_epochs=2
             --set train.clients_per_round=2)
else
  scale=full; device=auto; celm_limit=420; proxy_limit=180
  proxy_cut=(--rounds 10)
fi

reproduce() {  # reproduce LOG LIMIT ARGS...: one `fedhet reproduce` with a time limit
  local log=$1 limit=$2
  shift 2
  echo "== fedhet reproduce $* (limit ${limit} s)"
  local start=$SECONDS
  if ! timeout "$limit" "$PYTHON" -m fedhet reproduce "$@" --quiet >"$OUT/$log" 2>&1; then
    echo "   FAILED after $((SECONDS - start)) s (see $OUT/$log)"
    tail -n 5 "$OUT/$log"
    failed=1
  else
    echo "   done in $((SECONDS - start)) s"
  fi
}

"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
reproduce celm.log "$celm_limit" celm-table1-cifar10 --scale "$scale" --rows "Dir 0.05" --methods fedavg,celm \
  --seeds 1 --jobs 2 --set "train.device=$device" --out "$OUT/runs/celm" \
  --page "$OUT/results/celm-table1-cifar10.md"
reproduce proxyfl.log "$proxy_limit" proxyfl-table1 --scale "$scale" --rows "CIFAR-10 α=0.1" --methods proxyfl \
  --seeds 1 --set "train.device=$device" "${proxy_cut[@]}" --out "$OUT/runs/proxyfl" \
  --page "$OUT/results/proxyfl-table1.md"
ls -l "$OUT/results"
echo "failed: $failed"
exit $failed
