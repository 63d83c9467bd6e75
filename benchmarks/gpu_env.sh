# Shared set-up of the GPU scripts (sourced by gpu_check.sh and gpu_reproduce.sh): the repository root as the
# working directory, OUT from the first argument (default: $DEFAULT_OUT), PYTHON and the import path.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:-$DEFAULT_OUT}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
SCALE=${SCALE:-full}
failed=0
