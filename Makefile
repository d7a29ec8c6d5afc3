# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test fuzz lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: pip takes the CPU build that lies on this machine's disk.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	# ultralytics without its dependencies (the test extra has those its model builders use; see pyproject.toml)
	$(BIN)/pip install --quiet --no-deps ultralytics==8.4.190
	touch $(STAMP)

# Test-only system dependencies: Vulkan (lavapipe + ML SDK) for VGF, Chromium for the HTML report,
# a C compiler with OpenMP for the native CPU kernels and the Ethos-U header test.
TEST_STAMP := $(VENV)/.test-deps
$(TEST_STAMP): $(STAMP) scripts/setup_vulkan.sh scripts/setup_browser.sh scripts/setup_compiler.sh
	scripts/setup_compiler.sh
	scripts/setup_browser.sh
	scripts/setup_vulkan.sh
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/qlower demo

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -n 2 -q

# every fuzz and property suite with 2000 examples instead of CI's budget, random but repeatable:
# the seed is printed, and QLOWER_FUZZ_SEED=<seed> make fuzz runs the same examples again. The suites
# run in parallel through qlower.sweep's process pool (scripts/fuzz.py; FUZZ_WORKERS=K jobs at once)
fuzz: $(TEST_STAMP)
	@seed=$${QLOWER_FUZZ_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "make fuzz: hypothesis seed $$seed (repeat with QLOWER_FUZZ_SEED=$$seed make fuzz)"; \
	$(BIN)/python scripts/fuzz.py --seed $$seed --examples 2000 $${FUZZ_WORKERS:+--workers $$FUZZ_WORKERS}

lint: $(STAMP)
	$(BIN)/ruff check qlower tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/reference_speed.py
	$(BIN)/python benchmarks/compile.py
	$(BIN)/python benchmarks/compile.py --repeat 1 --targets ethos-u85-256 ethos-u55-128 vgf+int \
		--json benchmarks/results/compile_npu.json
	$(BIN)/python benchmarks/latency.py
	$(BIN)/python benchmarks/coverage.py
	$(BIN)/python benchmarks/litert_exactness.py
	$(BIN)/python benchmarks/vela_tflite.py
	$(BIN)/python benchmarks/tosa_execution.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
