# Two commands are all a user needs: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
POSENC := $(VENV)/bin/posenc
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench bench-install report clean

install: $(STAMP)

# torch is pinned here: these exact wheels are what the project is tested with.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.14.1 torchvision==0.29.1
	$(PIP) install --quiet -e '.[test]'
	# flush the ~5.5 GB just written before the tests run: fresh-clone dry runs here once timed
	# out in the Ctrl-C tests under heavy writeback. A precaution, not a proven cure: one dry
	# run with it failed the same way, and the CI runs since have passed with it
	sync
	touch $(STAMP)

test: install
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# posenc's main job on built-in data: the quickstart recipe (about 2 minutes on 2 CPU cores),
# its comparison table and plot, and two pictures of the library. Re-running keeps finished runs.
demo: install
	$(POSENC) list
	$(POSENC) train quickstart --out runs/quickstart --resume
	$(POSENC) compare runs/quickstart --out runs/quickstart/compare.png
	$(POSENC) viz-bias sinusoidal --length 64 --out runs/demo/sinusoidal.png
	$(POSENC) viz-buckets irpe --grid 9x9 --all-methods --out runs/demo/irpe-buckets.png

bench: install
	$(PY) benchmarks/attention_overhead.py

# The README's selection table (docs/report/) from the committed results files and profile: no
# run directories needed, so a fresh clone rebuilds it in seconds.
REPORT_STUDIES := docs/results/lm-extrapolation.json docs/results/length-gen/copy.json \
	docs/results/mnist-resolution.json docs/results/deit-mnist.json
report: install
	$(POSENC) report $(REPORT_STUDIES) --profile docs/profile/profile.json --out docs/report

# benchmarks/peers.py's extra (not needed by `make test`): x-transformers beside posenc. torch is
# named on the same line so that pip keeps the pinned wheels instead of resolving its own.
bench-install: install
	$(PIP) install --quiet -e '.[bench]' torch==2.14.1 torchvision==0.29.1

clean:
	rm -rf $(VENV) runs .pytest_cache
