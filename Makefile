# elmolab: `make run` runs the whole pipeline, `make smoke` a quick look beside it, `make test`
# the tests (all install first if needed).
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Where a CPU build of torch lies on this kind of machine; pip looks there first if it exists.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export DVC_NO_ANALYTICS := 1
export WANDB_SILENT := true
# OMP_WAIT_POLICY is left to the stages: pretrain and extract, alone on every core, spin
# (src/elmolab/core/openmp.py: a third faster than sleeping); set PASSIVE when jobs share the cores.
# glibc returns freed memory to the OS eagerly by default; page faults then eat ~20% of
# training time (docs/architecture.md §7). These keep large buffers mapped between steps.
export MALLOC_MMAP_THRESHOLD_ := 1073741824
export MALLOC_TRIM_THRESHOLD_ := 4294967296
export MALLOC_TOP_PAD_ := 268435456

VEGA_TEMPLATE := build/dvc-plots.html

.PHONY: help install data params run repro smoke test test-slow lint format bench clean \
	vega-template report plots wandb-sync wandb-report

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	# torch is pinned (==2.13.0) in the same pip call as everything else: without the pin,
	# lightning would pull a multi-GB CUDA build.
	$(PY) -m pip install -q $(FIND_LINKS) -c constraints.txt -e ".[dev,reports,sweep,slurm]"
	touch $(STAMP)

install: $(STAMP) data $(VEGA_TEMPLATE) ## Create .venv with every dependency and pull the data

# dvc plots show inlines vega from this template instead of loading it from a CDN.
$(VEGA_TEMPLATE): tools/vega_template.py | $(STAMP)
	$(PY) tools/vega_template.py --cdn-fallback $@

vega-template: $(STAMP) ## Rebuild the offline template of `dvc plots show` (vega inlined from npm)
	$(PY) tools/vega_template.py $(VEGA_TEMPLATE)

data: data/README.md ## Pull the raw data from the DVC remote into data/ (when data.dvc changed)

data/README.md: data.dvc $(STAMP)
	dvc pull -q data.dvc
	touch data/README.md

params: $(STAMP) ## Recompose params.yaml from conf/ (after editing conf/, or after a dvc exp run)
	$(PY) -m elmolab.core.params

# params.yaml must be conf/'s composition (one left by `dvc exp run -S` would run something else,
# or call it up to date); EXPERIMENT=<preset> composes conf/experiment/<preset>.yaml into it.
run: install ## Run the whole pipeline (dvc repro) as conf/ composes it; EXPERIMENT=<preset>: a preset
	$(PY) -m elmolab.core.params $(if $(EXPERIMENT),experiment=$(EXPERIMENT),--check)
	$(PY) -m elmolab.launch.estimate
	dvc repro

repro: run ## Same as run

smoke: install ## Quick look: experiment=smoke in smoke/ (minutes); the study's files stay as they are
	$(PY) -m elmolab.launch.quicklook

report: install ## Only the report stage: artifacts/report/index.html
	dvc repro report

# The template is named here, not in .dvc/config: a plain `dvc plots show` then works on a clone
# that has not built it (with DVC's own template, vega from a CDN).
plots: install ## DVC plots as offline HTML (dvc_plots/index.html)
	dvc plots show --html-template $(VEGA_TEMPLATE)

wandb-sync: $(STAMP) ## Upload offline W&B runs (wandb/) if WANDB_API_KEY is set and W&B answers
	$(PY) -m elmolab.core.tracking sync

wandb-report: $(STAMP) ## Build the W&B report: make wandb-report ENTITY=team GROUP=exp [UPLOAD=1]
	$(PY) -m elmolab.report.wandb_report --project $(or $(PROJECT),elmolab) --entity $(ENTITY) \
		--group $(GROUP) $(if $(UPLOAD),--upload)

test: install ## Run the tests (fast ones; the slow end-to-end checks: make test-slow)
	$(PY) -m pytest -q

test-slow: install ## Run the slow end-to-end checks (CI's smoke step)
	$(PY) -m pytest -q -m slow

lint: $(STAMP) ## ruff check and format check
	$(VENV)/bin/ruff check src pipelines tests bench tools
	$(VENV)/bin/ruff format --check src pipelines tests bench tools

format: $(STAMP) ## ruff format and fix
	$(VENV)/bin/ruff format src pipelines tests bench tools
	$(VENV)/bin/ruff check --fix src pipelines tests bench tools

# bench/pretrain_recipes.py is a tuning run (8-10 minutes per candidate) and bench/mix_variants.py
# a study of settings you name, not benchmarks.
BENCHES := $(filter-out bench/pretrain_recipes.py bench/mix_variants.py,$(wildcard bench/*.py))

bench: install ## Run the benchmarks in bench/ (prints ratios measured side by side)
	for b in $(BENCHES); do $(PY) $$b || exit 1; done

clean: ## Remove ad-hoc run folders (outputs/, multirun/); keeps artifacts/ and .venv
	rm -rf outputs multirun
