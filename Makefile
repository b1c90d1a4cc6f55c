# Two commands on a fresh machine: `make demo` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The local CPU wheel here; on a GPU host the same pin resolves to the CUDA build from PyPI.
TORCH_SPEC ?= torch==2.13.0
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export MPLBACKEND := Agg

.PHONY: setup system-packages test demo bench clean

# The PACS tests' real Orthanc (with DICOMweb), dciodvfy and dcmtk (the radiographs re-encoded in each transfer
# syntax), from Debian, where this runs as root and lacks them; elsewhere those tests skip and say why.
SYSTEM_PACKAGES := orthanc orthanc-dicomweb dicom3tools dcmtk
# Chromium and its driver for tests/test_ui_browser.py (fedauc ui's links in a real browser; nothing downloaded
# at test time).
SYSTEM_PACKAGES += chromium chromium-driver

setup: $(VENV)/.installed system-packages

system-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    ! { command -v Orthanc && command -v dciodvfy && command -v dcmcjpls && \
	        command -v chromium && command -v chromedriver && \
	        test -f /usr/share/orthanc/plugins/libOrthancDicomWeb.so; } >/dev/null; then \
		(apt-get install -y -q --no-install-recommends $(SYSTEM_PACKAGES) || \
		 { apt-get update -q && apt-get install -y -q --no-install-recommends $(SYSTEM_PACKAGES); }) >/dev/null \
		|| echo "could not install $(SYSTEM_PACKAGES): the PACS and browser tests will skip"; \
	fi

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# Two workers; a module's tests stay together and the NVIDIA FLARE consortium modules run one after another on
# one worker, first (tests/conftest.py: CONSORTIUM_GROUP); the 25 slowest tests are printed at the end.
test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25

demo: setup
	$(VENV)/bin/fedauc demo

# gpu.py measures a GPU: on a machine without one it checks its harness (--smoke) instead of stopping the loop.
bench: setup
	cuda=$$($(PY) -c "import torch; print(int(torch.cuda.is_available()))"); \
	for b in benchmarks/*.py; do \
		if [ $$b = benchmarks/gpu.py ] && [ $$cuda = 0 ]; then $(PY) $$b --smoke || exit 1; else $(PY) $$b || exit 1; fi; \
	done

clean:
	rm -rf $(VENV) .prefect mlruns.db mlartifacts .cache build *.egg-info
