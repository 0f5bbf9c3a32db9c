# Set-up is part of every target: the first run creates .venv and installs rloo into it.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# The main job: SFT -> reward model -> RLOO -> evaluation on the default built-in task.
# Extra settings: make demo ARGS="task=dialogue"
demo: $(STAMP)
	$(VENV)/bin/rloo pipeline output_dir=runs/demo --overwrite $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

clean:
	rm -rf $(VENV) runs
