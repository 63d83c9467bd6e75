#!/usr/bin/env bash
# The whole GPU check in one script, for a lent accelerator (a GPU is never required; CI has none):
# the CUDA tests (tests/test_gpu.py: no host sync per local step, data and models on the device, CPU/GPU
# agreement), the GPU round benchmark (benchmarks/gpu_round.py: CELM CIFAR-10 round / bare loop, utilisation,
# host syncs, ProxyFL ResNet-8 client round) and the augmentation speed on the device. Budget: under 5 minutes.
#
#   benchmarks/gpu_check.sh [OUT_DIR]          # default OUT_DIR: build/gpu-check
#
# Writes OUT_DIR/<step>.log for each step, OUT_DIR/gpu_round.json (the result object `make bench` gathers when
# it finds it in build/gpu-check/) and OUT_DIR/nvidia-smi.txt; exits non-zero if a step failed.
# Environment: PYTHON (default .venv/bin/python, else python3), SCALE=full|tiny (tiny: a CPU-sized cut, to test
# this script), DEVICE=auto|cuda|cpu, FEDHET_DATA=a folder holding cifar10-jpg.tar.gz (else the shared copy).
# Test it on a CPU with:  SCALE=tiny DEVICE=cpu benchmarks/gpu_check.sh /tmp/gpu-check
set -uo pipefail
DEFAULT_OUT=build/gpu-check
# shellcheck source=benchmarks/gpu_env.sh
source "$(dirname "$0")/gpu_env.sh"
DEVICE=${DEVICE:-auto}

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT/NAME.log, show its last lines
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit} s): $*"
  local start=$SECONDS
  if ! timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
    echo "   FAILED after $((SECONDS - start)) s (see $OUT/$name.log)"
    failed=1
  fi
  tail -n 4 "$OUT/$name.log" | cut -c1-300
  echo "   ($((SECONDS - start)) s)"
}

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not available" >"$OUT/nvidia-smi.txt"
head -n 12 "$OUT/nvidia-smi.txt"
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
step test_gpu 90 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_gpu.py -rs
step gpu_round 150 "$PYTHON" benchmarks/gpu_round.py --device "$DEVICE" --scale "$SCALE" --json
tail -n 1 "$OUT/gpu_round.log" | grep '^{' >"$OUT/gpu_round.json" || rm -f "$OUT/gpu_round.json"
AUG_DEVICE=$DEVICE
[ "$AUG_DEVICE" = auto ] && AUG_DEVICE=$("$PYTHON" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
AUG_REPEATS=10
[ "$SCALE" = tiny ] && AUG_REPEATS=2  # the CPU test of this script: that the step runs, not its timing
step augment 45 "$PYTHON" benchmarks/augment_speed.py --device "$AUG_DEVICE" --repeats "$AUG_REPEATS"
echo "results in $OUT; failed steps: $failed"
exit $failed
