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

demo: $(BIN)/.installed
	$(BIN)/triton-nb demo

test: $(BIN)/.installed
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
