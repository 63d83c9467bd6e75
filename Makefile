# fedhet — one command sets up everything on a fresh machine.
#   make demo   set up, then run the main comparison on real data (a few minutes on 2 cores)
#   make test   set up, then run the test suite (and the numeric tests again under other kernels)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.fedhet-installed
FMNIST  = /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: setup test test-numerics demo bench lint mutation clean data

setup: $(STAMP) data

# torch first, pinned: the CPU wheel that lies on these machines (an open range pulls a multi-GB CUDA build).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,flower,tensorboard,tables]"
	touch $(STAMP)

# Fashion-MNIST from the Debian package, when it is missing and apt is usable (root).
data:
	@if [ ! -f $(FMNIST) ]; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null)); \
	  else \
	    echo "note: Fashion-MNIST missing; run 'sudo apt-get install dataset-fashion-mnist' or pass --data-root"; \
	  fi; \
	fi

# Two worker processes (pytest-xdist), one torch thread each: the suite is full of subprocesses and servers
# that wait, so two workers on two cores take about half the time of one. Tests sharing a session fixture
# carry the same xdist_group and run in one worker; the slow ones are handed out first (tests/conftest.py).
# The suite includes tests/test_numerics_passes.py: the numeric-equivalence tests (marker `numerics`) once
# more under other CPU kernels, two threads and flushed denormals, each pass a pytest process of its own.
test: setup
	$(PY) -m pytest tests -n 2 --dist loadgroup --durations=20

# Those four passes alone.
test-numerics: setup
	$(PY) -m pytest tests/test_numerics_passes.py -n 2

demo: setup
	$(VENV)/bin/fedhet compare configs/celm/fmnist-maverick.toml --methods fedavg,celm --rounds 30 --set eval.every=2 \
	  --seeds 2 --jobs 2 --out runs/demo --title "fedhet demo: FedAvg vs CELM on the Fashion-MNIST maverick split"

# Every benchmark (about 20 to 25 minutes on 2 cores: flower_rounds about 5 of them, estimator_cost about 6); writes docs/performance.md and its plots. GPU: benchmarks/gpu_check.sh
bench: setup
	$(PY) benchmarks/run_all.py

# Mutation testing of the formula modules (not in CI: several hours on 2 cores; resumable); kill rates per module.
mutation: setup
	$(PY) tools/mutation.py

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks tools

clean:
	rm -rf runs report.md report_figures .pytest_cache mutants
