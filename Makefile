# The README's two commands: `make demo` and `make test`. Both start from a
# fresh clone: they create .venv, install pressrun with pinned dependencies and
# the system programs it needs, then run.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pressrun's PyO3 binding over the Rust crate flute, built with maturin (docs/multicast.md)
NATIVE := native/pressrun-flute
NATIVE_STAMP := $(VENV)/.native-installed

.PHONY: demo test lint typecheck contracts unit bench setup system clean images emulate

# the system programs first (python3-venv, cc, Rust: scripts/setup-system.sh)
$(STAMP): pyproject.toml | system
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip==25.3
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

$(NATIVE_STAMP): $(STAMP) $(NATIVE)/Cargo.toml $(NATIVE)/Cargo.lock $(NATIVE)/pyproject.toml $(wildcard $(NATIVE)/src/*.rs $(NATIVE)/src/*/*.rs) $(NATIVE)/pressrun_flute.pyi
	./scripts/check-rust.sh
	PATH="$$(./scripts/check-rust.sh --dir):$$PATH" CARGO_TARGET_DIR="$(CURDIR)/$(NATIVE)/target" \
		$(BIN)/pip install -q ./$(NATIVE)
	touch $(NATIVE_STAMP)

system:
	PY=$(PY) ./scripts/setup-system.sh

# The web reader's npm packages (libsodium.js, pdf.js), exactly as the lockfile says.
READER := src/pressrun/reader
READER_STAMP := $(READER)/node_modules/.installed
$(READER_STAMP): $(READER)/package-lock.json | system
	cd $(READER) && npm ci --omit=optional --no-audit --no-fund
	touch $(READER_STAMP)

setup: $(STAMP) $(NATIVE_STAMP) system $(READER_STAMP)

demo: setup
	$(BIN)/pressrun demo

# the docker compose emulation (docs/emulation.md); SCENARIO=small for a quick one
SCENARIO ?= flash-crowd
images: setup
	$(BIN)/pressrun emulate --build-only

emulate: setup
	$(BIN)/pressrun emulate --scenario $(SCENARIO)

lint: $(STAMP) $(NATIVE_STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP) $(NATIVE_STAMP)
	$(BIN)/mypy

contracts: $(STAMP) $(NATIVE_STAMP)
	$(BIN)/lint-imports

# three workers: most tests wait on sockets, processes and browsers, not on the CPU;
# tests/conftest.py keeps a file on one worker and runs the docker, multicast and
# egress-timing tests one after another
unit: setup
	$(BIN)/pytest -q -n 3 --dist loadgroup --durations=15

test: lint typecheck contracts unit

bench: setup
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(NATIVE)/target build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
