# draftdoctor: one-command set-up, demo and tests. See README.md.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# where the kit builds and installs (draftdoctor.toolstate reads the same variable)
BUILD := $(or $(DRAFTDOCTOR_STATE),$(CURDIR)/build)
TORCH := torch==2.13.0
# the build backend, the one pyproject.toml's [build-system] pins: a wheel built from .venv without build
# isolation (tests/test_installed.py) is built by the same setuptools as an isolated build
SETUPTOOLS := setuptools==84.2.1

# Keep tool state (Jupyter, IPython, matplotlib, HF caches) out of the home directory.
export JUPYTER_CONFIG_DIR := $(BUILD)/state/jupyter/config
export JUPYTER_DATA_DIR := $(BUILD)/state/jupyter/data
export JUPYTER_RUNTIME_DIR := $(BUILD)/state/jupyter/runtime
export IPYTHONDIR := $(BUILD)/state/ipython
export MPLCONFIGDIR := $(BUILD)/state/matplotlib
export VLLM_CACHE_ROOT := $(BUILD)/state/vllm/cache
export VLLM_CONFIG_ROOT := $(BUILD)/state/vllm/config
export TORCHINDUCTOR_CACHE_DIR := $(BUILD)/state/torchinductor
export HF_HOME := $(BUILD)/state/hf
export XDG_CACHE_HOME := $(BUILD)/state/cache
export HF_HUB_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup test test-fast demo clean
.DEFAULT_GOAL := demo

setup: $(VENV)/.venv-complete

# torch first: any other route lets pip pick a multi-GB CUDA build.
# Every package under requirements/venv.txt's pins (pip -c): the venv a fresh machine builds is the one the
# suite passed with, whatever PyPI has published since.
PINS := -c requirements/venv.txt
$(VENV)/.setup-done: pyproject.toml requirements/venv.txt | $(VENV)/.created
	$(BIN)/pip install -q $(PINS) $(TORCH) $(SETUPTOOLS)
	$(BIN)/pip install -q $(PINS) -e '.[dev]'
	# the notebooks' kernelspec `python3`, inside .venv (not the home directory)
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (draftdoctor)" >/dev/null
	touch $@

# The bare venv, its pip as the interpreter brought it: what needs no more (EARLY_NEEDS, such as downloading and
# building llama.cpp) starts from here, beside the installs into it.
$(VENV)/.created:
	mkdir -p $(IPYTHONDIR) $(MPLCONFIGDIR) $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR) $(JUPYTER_RUNTIME_DIR) $(HF_HOME) $(XDG_CACHE_HOME)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	touch $@

# Every install into .venv is done (mk/*.mk add theirs as prerequisites): what imports from it waits for this.
$(VENV)/.venv-complete: $(VENV)/.setup-done
	touch $@

# What the tests need (mk/*.mk add theirs). What needs only the bare venv (EARLY_NEEDS: llama.cpp's build) starts
# at once, beside the venv's own installs (pip mostly keeps one core busy); the rest (TEST_NEEDS: the release
# installs: pip reading its index, the self-checks, CPU-bound, two at a time) once the venv is complete. While they are made, the
# first tier runs: every test that needs no engine release, no browser and not the whole story (`make
# test-fast`'s), with the releases hidden (an empty folder in their place) so that `--loader auto` answers alike
# whichever install has finished; then the second tier, the rest. The suite on two workers (pytest-xdist; tests
# sharing a module's fixture stay together: conftest.py); each tier prints its time per marker at its end.
EARLY_NEEDS :=
TEST_NEEDS :=
NO_RELEASES := $(BUILD)/state/no-releases
FIRST_TIER := not engine and not browser and not story
LOGS := $(BUILD)/logs
test: $(VENV)/.created
	@mkdir -p $(NO_RELEASES) $(LOGS)
	@echo "make test: building what needs only the bare venv (log: $(LOGS)/early-needs.log) while the venv is set up"
	@( $(MAKE) $(or $(EARLY_NEEDS),$(VENV)/.created) FOR_TESTS=1 > $(LOGS)/early-needs.log 2>&1; echo $$? > $(LOGS)/early-needs.status ) & \
	$(MAKE) setup || { wait; exit 1; }; \
	echo "make test: installing the engine releases and the browser (log: $(LOGS)/test-needs.log) while the first tier runs"; \
	( $(MAKE) -j2 $(TEST_NEEDS) FOR_TESTS=1 > $(LOGS)/test-needs.log 2>&1; echo $$? > $(LOGS)/test-needs.status ) & \
	DRAFTDOCTOR_SGLANG_DIR=$(NO_RELEASES) DRAFTDOCTOR_VLLM_DIR=$(NO_RELEASES) DRAFTDOCTOR_LLAMACPP_DIR=$(NO_RELEASES) \
	  $(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "$(FIRST_TIER)"; first=$$?; \
	wait; \
	for needs in early-needs test-needs; do if [ "$$(cat $(LOGS)/$$needs.status)" != 0 ]; then \
	  tail -n 40 $(LOGS)/$$needs.log; echo "make test: making what the second tier needs failed ($(LOGS)/$$needs.log)" >&2; \
	  exit 1; fi; done; \
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not ($(FIRST_TIER))"; second=$$?; \
	test $$first = 0 && test $$second = 0

# The tests that need no engine release and no browser (conftest marks those), less the few that run the
# whole story end to end (marked `story`): minutes, not half an hour.
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not engine and not browser and not story"

# The whole investigation of the bundled demo: keys, names, coverage, fix, acceptance before/after, each
# draft loaded as SGLang 0.5.10's own loader leaves it (its release installed first: mk/sglang.mk's rules).
DEMO_RELEASE := 0.5.10
demo: setup $(BUILD)/sglang/$(DEMO_RELEASE)/.installed
	$(BIN)/draftdoctor demo --out runs/demo
	@echo "report: runs/demo/report.md (chart: runs/demo/acceptance.png)"

clean:
	rm -rf $(VENV) $(BUILD)

-include mk/*.mk
