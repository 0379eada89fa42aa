# The two commands of the README: `make demo` and `make test`.
# Both are idempotent: they create .venv and install what is missing, then run.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.joynexus-installed

.PHONY: demo test install lint typecheck unit clean

demo: install
	$(BIN)/joynexus demo

test: install lint typecheck unit

install: $(STAMP)

# Re-run the install whenever the dependency declarations change.
$(STAMP): pyproject.toml scripts/install-system-deps.sh scripts/enable-debian-backports.sh \
		scripts/install-python-extras.sh scripts/install-lerobot-reference.sh
	bash scripts/install-system-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,sim,ray,trackers]'
	bash scripts/install-python-extras.sh $(BIN)/python
	# Today's lerobot (Python 3.13, cached outside the checkout): not fatal here; without
	# it the interop tests against it fail and say why.
	bash scripts/install-lerobot-reference.sh || echo "install: no LeRobot reference environment" >&2
	touch $(STAMP)

lint:
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck:
	$(BIN)/mypy src/joynexus

unit:
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
