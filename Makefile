# Set-up and entry points. `make demo` and `make test` each create the local virtual
# environment (.venv) on first use and reinstall when pyproject.toml changes.
PYTHON ?= python3
CHROMIUM ?= /usr/bin/chromium
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-pandas2 chromium wrk lint bench repository notebooks docs clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The tests also run a real Triton server: the tritonserver binary that nvidia-pytriton ships
# (--no-deps: its numpy<2 pin would downgrade the whole environment). Triton's Python-backend
# stub is built against numpy 1.x, so it gets its own numpy<2 packages, searched first
# (see tests/helpers/real_triton.py).
$(BIN)/.triton-installed: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet --no-warn-conflicts --no-deps nvidia-pytriton==0.7.0
	$(BIN)/python -m pip install --quiet --no-warn-conflicts --upgrade --target $(VENV)/triton-stub-site \
		"numpy<2" "pandas<3"
	touch $@

# The browser test (tests/notebooks/test_browser.py) drives Debian's chromium through Playwright
# (Playwright's own browser download is not used). Installed with apt when this user can (root, or
# password-less sudo); otherwise one line says how, and only that test fails.
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then \
	    SUDO="sudo"; else SUDO="none"; fi; \
	  if [ "$$SUDO" != none ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the browser test (apt-get install chromium)"; mkdir -p $(VENV); \
	    { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; } \
	      >$(VENV)/chromium-install.log 2>&1 \
	      || echo "apt-get install chromium failed (see $(VENV)/chromium-install.log): the browser test fails"; \
	  else \
	    echo "chromium is missing and cannot be installed here (needs apt and root or sudo): run 'sudo apt-get install chromium' (Debian/Ubuntu); until then tests/notebooks/test_browser.py fails"; \
	  fi; \
	fi

# pandas 2.2 (the series cuDF pins) for the code that handles frames: its tests run a second time
# with pandas 2.2 in a folder of its own, searched before the environment's pandas 3.
$(VENV)/pandas2-site/.installed: $(BIN)/.triton-installed
	$(BIN)/python -m pip install --quiet --no-warn-conflicts --no-deps --upgrade --target $(VENV)/pandas2-site \
		"pandas==2.2.*" pytz
	touch $@

demo: $(BIN)/.installed
	$(BIN)/triton-nb demo

test: $(BIN)/.triton-installed chromium
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

PANDAS2_TESTS := tests/fraud tests/repository tests/server/test_server.py tests/server/test_fraud_serving.py \
	tests/server/test_batcher.py tests/server/test_stats.py tests/perf/test_inputs.py

test-pandas2: $(VENV)/pandas2-site/.installed
	PYTHONPATH=$(VENV)/pandas2-site $(BIN)/python -c \
		'import pandas; assert pandas.__version__.startswith("2.2."), pandas.__version__; print("pandas", pandas.__version__)'
	PYTHONPATH=$(VENV)/pandas2-site $(BIN)/python -m pytest -q -p no:cacheprovider $(PANDAS2_TESTS)

lint: $(BIN)/.installed
	$(BIN)/ruff check .

# bench_frontends.py and bench_perf_tool.py load HTTP with Debian's wrk: installed with apt when
# this user can (root, or password-less sudo); otherwise one line says how.
wrk:
	@if ! command -v wrk >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then \
	    SUDO="sudo"; else SUDO="none"; fi; \
	  if [ "$$SUDO" != none ] && command -v apt-get >/dev/null; then \
	    mkdir -p $(VENV); \
	    { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq wrk; } \
	      >$(VENV)/wrk-install.log 2>&1 || { echo "apt-get install wrk failed (see $(VENV)/wrk-install.log)"; exit 1; }; \
	  else echo "make bench needs wrk: run 'sudo apt-get install wrk' (Debian/Ubuntu)"; exit 1; fi; \
	fi

# Every benchmark in bench/ with its defaults, about 25 minutes on 2 cores; bench_frontends.py also
# runs real Triton (hence .triton-installed). README's figures come from the runs it names.
bench: $(BIN)/.triton-installed wrk
	$(BIN)/python bench/bench_preprocessing.py
	$(BIN)/python bench/bench_fil.py
	$(BIN)/python bench/bench_server.py
	$(BIN)/python bench/bench_perf_tool.py
	$(BIN)/python bench/bench_soak.py
	$(BIN)/python bench/bench_frontends.py

# Regenerate the checked-in example repository (tests/repository/test_reference_repository.py
# checks it is current): `triton-nb export --model-repository model_repository --overwrite`, then a header in each
# config and Python file naming its source, a README.md, and the .gitkeep of the ensemble's empty 1/.
repository: $(BIN)/.installed
	$(BIN)/python tools/reference_repository.py model_repository

# Execute the notebooks in notebooks/ in order, in place, with their default (full-size) parameters, in a
# temporary folder, keeping their outputs (tests/notebooks/test_committed_outputs.py checks they are current).
notebooks: $(BIN)/.installed
	$(BIN)/python tools/execute_notebooks.py

# The documentation site (mkdocs.yml, docs/) into site/, strict: a broken link, a missing page or a
# docstring the reference cannot render fails it. The reference pages are generated from the code
# at build time (docs/hooks/reference.py). The banner about MkDocs 2 is silenced: mkdocs is pinned <2.
$(BIN)/.docs-installed: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	touch $@

docs: $(BIN)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) triton-nb-demo site .pytest_cache .ruff_cache
