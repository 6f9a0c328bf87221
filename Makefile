# Two commands are all a user needs: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
POSENC := $(VENV)/bin/posenc
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench clean

install: $(STAMP)

# torch is pinned here: these exact wheels are what the project is tested with.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.14.1 torchvision==0.29.1
	$(PIP) install --quiet -e '.[test]'
	touch $(STAMP)

test: install
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: install
	$(POSENC) list
	$(POSENC) viz-bias sinusoidal --length 64 --out demo/sinusoidal.png
	$(POSENC) viz-bias alibi heads=4 --length 32 --out demo/alibi.png

bench: install
	$(PY) benchmarks/attention_overhead.py

clean:
	rm -rf $(VENV) demo .pytest_cache
