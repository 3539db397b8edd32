# marin-assets: everyday commands. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

# The embedded default: instance and data inside the checkout, the offline demo Hub.
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export MARIN_PREFIX ?= $(CURDIR)/.marin_data
export MARIN_DEMO_HUB ?= $(CURDIR)/.demo_hub
export GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT = false
export HF_HUB_DISABLE_TELEMETRY = 1
PORT ?= 3000

.PHONY: install demo dev test test-fast faults bench bench-scale rehearse check clean home

install: $(VENV)/.installed

# The one install recipe: deploy/Dockerfile runs it too (`make install ACCELERATOR=... EXTRAS=`).
# torch first, pinned: it takes the CPU wheel; an unpinned torch pulls a multi-GB CUDA build.
# ACCELERATOR=cuda takes the same torch from the CUDA wheel index instead (the GPU image).
# EXTRAS: the optional dependency groups (`test` here; the image leaves them out).
ACCELERATOR ?= cpu
EXTRAS ?= test
TORCH_INDEX_cpu :=
TORCH_INDEX_cuda := https://download.pytorch.org/whl/cu128
TORCH_INDEX = $(TORCH_INDEX_$(ACCELERATOR))
ifeq ($(filter $(ACCELERATOR),cpu cuda),)
$(error ACCELERATOR=$(ACCELERATOR): use cpu or cuda)
endif

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) )torch==2.13.0
	$(BIN)/pip install -q -e ".$(if $(EXTRAS),[$(EXTRAS)])"
	touch $@

# The instance's storage is created here, once, before any run: runs started at once on a fresh
# instance would each create it.
home:
	@mkdir -p $(DAGSTER_HOME) $(MARIN_PREFIX)
	@ln -sf $(CURDIR)/dagster.yaml $(DAGSTER_HOME)/dagster.yaml
	@$(BIN)/marin-assets instance

## Run the whole pipeline offline on the bundled sample, into DAGSTER_HOME and MARIN_PREFIX.
demo: install home
	$(BIN)/marin-assets demo

## The Dagster UI (webserver + daemon) on the embedded default.
dev: install home
	$(BIN)/dagster instance concurrency set hf_download 4 >/dev/null
	$(BIN)/marin-assets dev --port $(PORT)

## Every test (CI runs this). test-fast leaves out the system tests (marker `system`:
## PostgreSQL, daemon, browser, the whole demo pipeline, other slow end-to-end runs) and
## spreads the rest over the cores (pytest-xdist, at most 4 workers; a module stays on one worker,
## so its module-scoped fixtures are built once, and the longest modules start first: see
## marin_assets_tests/conftest.py).
test: install
	$(BIN)/python -m pytest -q

# test-fast keeps the tests' scratch (pytest's tmp_path, the temporary Dagster instances and their
# SQLite files) in memory when /dev/shm is writable and has 2 GiB free (a container's is often
# 64 MiB): on disk, SQLite's fsyncs were about half of the wall time of the instance-heavy modules.
# FAST_TMPDIR= keeps the system temp folder.
FAST_TMPDIR ?= $(shell test -w /dev/shm && test "$$(df -Pk /dev/shm | awk 'NR==2 {print $$4}')" -gt 2097152 && echo /dev/shm)

# It also keeps Python's bytecode caches (__pycache__, ignored by git) where the environment turns
# them off (PYTHONDONTWRITEBYTECODE): without them each worker and each subprocess compiles the
# package again and pytest parses and rewrites every test module again, ~3 CPU-s per worker.
test-fast: install
	$(if $(FAST_TMPDIR),TMPDIR=$(FAST_TMPDIR) )PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -m "not system" -n auto --maxprocesses 4 --dist loadfile

## The fault and security suite; its last line sums faults injected, rows lost, files outside the prefix, credentials sent off-host, task peaks over their size.
## Races of two runs (one partition, local disk and Cloud Storage; a fresh instance) go FAULT_WRITER_ROUNDS rounds (`make test`: 2).
FAULT_WRITER_ROUNDS ?= 5
faults: install
	FAULT_WRITER_ROUNDS=$(FAULT_WRITER_ROUNDS) $(BIN)/python -m pytest -q marin_assets_tests/faults

check: install
	$(BIN)/dg check defs

## Benchmarks against their peers; ONLY=minhash,normalize selects, BENCH_QUICK=1 shortens.
bench: install
	$(BIN)/python -m bench $(if $(ONLY),--only $(ONLY))

## Every per-shard stage on a local Ray (2 workers) at 1x/4x/16x of 200 MiB (24 min on 2 idle cores; BENCH_QUICK=1: minutes).
bench-scale: install
	$(BIN)/python bench/scale.py

clean:
	rm -rf $(DAGSTER_HOME) $(MARIN_PREFIX) $(MARIN_DEMO_HUB)

## The full pool's shape on this machine: drivers at 372,529 shards on metadata, tasks on a request-counting store (BENCH_QUICK=1: 10 sources, 1x/4x).
rehearse: install
	$(BIN)/python bench/rehearse.py
