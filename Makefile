# Set-up and entry points. `make demo` and `make test` each create the local virtual
# environment (.venv) on first use and reinstall when pyproject.toml changes.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench repository clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The tests also run a real Triton server: the tritonserver binary that nvidia-pytriton ships
# (--no-deps: its numpy<2 pin would downgrade the whole environment). Triton's Python-backend
# stub is built against numpy 1.x, so it gets its own numpy<2 packages, searched first
# (see tests/real_triton.py).
$(BIN)/.triton-installed: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet --no-deps nvidia-pytriton==0.7.0
	$(BIN)/python -m pip install --quiet --upgrade --target $(VENV)/triton-stub-site "numpy<2" "pandas<3"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/triton-nb demo

test: $(BIN)/.triton-installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed
	$(BIN)/ruff check .

bench: $(BIN)/.installed
	$(BIN)/python bench/bench_preprocessing.py

# Regenerate the checked-in example repository (tests/repository/test_reference_repository.py
# checks it is current). git keeps no empty folders, hence the .gitkeep in the ensemble's 1/.
repository: $(BIN)/.installed
	$(BIN)/triton-nb export --out model_repository --overwrite
	touch model_repository/ensemble/1/.gitkeep

clean:
	rm -rf $(VENV) triton-nb-demo .pytest_cache .ruff_cache
