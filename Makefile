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

# Two workers (three were tried: CONTRIBUTING.md "The suite's time"); a module's tests stay together and the NVIDIA
# FLARE consortium modules run one after another on one worker, first (tests/conftest.py: CONSORTIUM_GROUP); the
# 25 slowest tests are printed at the end. A worker that dies (a signal, an abort in native code) ends the run at
# once, naming the test it was running: xdist 3.8 replaces it otherwise, and under --dist loadfile the run then
# hangs once the other tests are done (tests/test_suite_schedule.py), until CI's limit.
test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0 --durations=25

demo: setup
	$(VENV)/bin/fedauc demo

# Every benchmark's entry point, run as `python -m benchmarks.<name>` (tests/test_benchmark_imports.py checks the
# list against benchmarks/); the modules they import are not run on their own.
BENCHMARKS := claims claims.stagewise claims.window \
	studies.auc_methods studies.codasca_period studies.demo_difficulty studies.fedxl_pauc studies.near_duplicates \
	studies.ood_demo studies.privacy studies.sigmoid_surrogate_temperature studies.sweep_rates \
	throughput.cli_startup throughput.engine throughput.flare throughput.gpu throughput.networks_cpu \
	throughput.pacs_memory throughput.predict throughput.preprocess \
	scale peers year year.compare

# throughput.gpu measures a GPU: on a machine without one it checks its harness (--smoke) instead of stopping
# the loop. year.compare times `fedauc compare` on the stores the year before it wrote (a fresh folder each time).
bench: setup
	cuda=$$($(PY) -c "import torch; print(int(torch.cuda.is_available()))"); \
	year=$$(mktemp -d); \
	for b in $(BENCHMARKS); do \
		case $$b in \
			throughput.gpu) options=$$([ $$cuda = 1 ] || echo --smoke);; \
			year) options="--keep $$year";; \
			year.compare) options="--store $$year";; \
			*) options=;; \
		esac; \
		$(PY) -m benchmarks.$$b $$options || exit 1; \
	done; \
	rm -rf $$year

clean:
	rm -rf $(VENV) .prefect mlruns.db mlartifacts .cache build *.egg-info
