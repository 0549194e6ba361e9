# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv on first use (from requirements pinned in setup.py) and reuse it.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install rocm clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# gfx90a (MI250X) code objects need Debian's device bitcode and an ld.lld 17+ (ld.lld 14
# rejects TVM's code objects): tvm_fusion/gpu/amdgpu.py. Installed where this runs as root
# with apt-get; elsewhere the MI250X build tests skip and say the apt-get line.
ROCM_DEBS := rocm-device-libs lld-19
rocm:
	@if dpkg -s $(ROCM_DEBS) >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q --no-install-recommends $(ROCM_DEBS) >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && \
	    apt-get install -y -q --no-install-recommends $(ROCM_DEBS) >/dev/null 2>&1; } || \
	  echo "make rocm: apt-get install $(ROCM_DEBS) failed; MI250X builds will be skipped"; \
	else echo "make rocm: run 'apt-get install $(ROCM_DEBS)' as root to build for MI250X"; fi

install: $(STAMP) rocm

demo: $(STAMP)
	$(BIN)/tvm-fusion demo

# Two workers: the suite keeps TVM on one thread (tests/conftest.py), so each worker fills
# one core; a file's tests stay on one worker so its module fixtures are built once.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

clean:
	rm -rf $(VENV) build *.egg-info
