# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv on first use (from requirements pinned in setup.py) and reuse it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/tvm-fusion demo

# Two workers: the suite keeps TVM on one thread (tests/conftest.py), so each worker fills
# one core; a file's tests stay on one worker so its module fixtures are built once.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

clean:
	rm -rf $(VENV) build *.egg-info
