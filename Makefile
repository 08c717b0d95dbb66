# Two commands for a fresh machine with only Python 3 and pip:
#   make demo   installs into .venv and runs the main job (analyze ResNet-50 training on an H100)
#   make test   installs into .venv and runs the fast test suite (make test-all: everything)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dlperf-installed
# torch/torchvision pinned to the tested pair (served from the local wheel cache on our machines).
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1

.PHONY: demo test test-slow test-all fuzz install clean bench-analyze bench-predict bench-data bench-data-ladder bench-train bench-digits bench-kernels

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_PINS)
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m dlperf.data.native
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dlperf analyze resnet50 --device h100-sxm --batch-size 256 --dtype bf16 --train \
		--json dlperf-report.json

# the fast suite (~2.5 min on 2 cores); test-all adds the slow tests (~5.5 min), what CI runs
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" --durations=10

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow --durations=10

test-all: $(STAMP)
	$(BIN)/python -m pytest --durations=20

# the native JPEG core under AddressSanitizer + UndefinedBehaviorSanitizer for 90 s (CI runs it;
# `make test` runs the same harness for 20 s)
fuzz: $(STAMP)
	DLPERF_FUZZ_SECONDS=$${DLPERF_FUZZ_SECONDS:-90} $(BIN)/python -m pytest -q -s tests/test_fuzz_native.py

bench-analyze: $(STAMP)
	$(BIN)/python benchmarks/bench_analyze.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache dlperf-report.json

bench-predict: $(STAMP)
	$(BIN)/python benchmarks/bench_predict_vs_measure.py

# CORPUS: an ImageNet-layout JPEG folder [dlperf's own, `dlperf data corpus`, made once]
bench-data: $(STAMP)
	$(BIN)/dlperf bench data $(CORPUS) --rounds 10

bench-data-ladder: $(STAMP)
	$(BIN)/dlperf bench data $(CORPUS) --ladder --rounds 10

# the guide's GEMM and convolution figures on this machine, predicted with a calibrated probe
bench-kernels: $(STAMP)
	$(BIN)/dlperf probe --quick --sweep --out benchmarks/results/probe-cpu-sweep.json
	$(BIN)/dlperf bench gemm --spec benchmarks/results/probe-cpu-sweep.json
	$(BIN)/dlperf bench conv --spec benchmarks/results/probe-cpu-sweep.json

bench-train: $(STAMP)
	$(BIN)/dlperf bench train --compile

# real-data sanity for dlperf train: needs scikit-learn (for its bundled digits), installed here
bench-digits: $(STAMP)
	$(BIN)/python -m pip install -q scikit-learn
	$(BIN)/python benchmarks/bench_digits.py
