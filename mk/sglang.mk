# SGLang releases for the real loader (draftdoctor.realload): one folder per release under the build
# area, each `pip install --no-deps --target` from its pinned list, sharing the venv's CPU torch.
# RELEASES: unset, the ones CI needs (realload/ci_releases.txt, one per profile range); "all", every
# release with a pin list (then the release sweep runs and rewrites docs/releases/sglang.md); or a list.
REALLOAD := lib/draftdoctor/realload
ci_releases = $(shell awk '$$1 == "$(1)" {print $$2}' $(REALLOAD)/ci_releases.txt)
ALL_SGLANG := $(patsubst $(REALLOAD)/requirements-%.txt,%,$(wildcard $(REALLOAD)/requirements-*.txt))
SGLANG_RELEASES := $(if $(filter all,$(RELEASES)),$(ALL_SGLANG),$(or $(RELEASES),$(call ci_releases,sglang)))
SGLANG_DIR := $(BUILD)/sglang
# What the release folders (SGLang's and vLLM's) have in common, kept once (realload/linkstore.py).
RELEASE_STORE := $(BUILD)/release-store

.PHONY: sglang-loaders
sglang-loaders: setup $(foreach r,$(SGLANG_RELEASES),$(SGLANG_DIR)/$(r)/.installed $(SGLANG_DIR)/$(r)/.linked)
ifeq ($(RELEASES),all)
	$(BIN)/python -m draftdoctor.proofs.sweep sglang --out docs/releases/sglang.md
endif

# One implementation with `draftdoctor loaders install` (realload/install.py): the pin list refused if it
# would bring torch, CUDA/nvidia wheels, sgl-kernel or triton; `pip install --no-deps --no-compile --target`;
# the marker written only after the child's self-check passed in the fresh folder (the adapter fits, a tiny
# draft loads), run as every check runs it: the release sees its folder and the venv's torch, nothing else
# of the venv (realload/torchview.py). The venv is order-only (its torch is shared, but re-running
# `make setup` must not reinstall every release).
$(SGLANG_DIR)/%/.installed: $(REALLOAD)/requirements-%.txt | $(VENV)/.venv-complete
	$(BIN)/python -m draftdoctor.realload.install sglang $* --folder $(@D) --no-link

# An install links what a finished release folder holds instead of unpacking it again (realload/reuse.py): the
# first release is installed before the others, which then take all but a few pins from it (two at once from
# nothing would each unpack them all); the other job meanwhile installs vLLM's first (mk/vllm.mk)
SGLANG_FIRST := $(firstword $(SGLANG_RELEASES))
$(foreach r,$(filter-out $(SGLANG_FIRST),$(SGLANG_RELEASES)),$(SGLANG_DIR)/$(r)/.installed): | $(SGLANG_DIR)/$(SGLANG_FIRST)/.installed

# Then the files it has in common with other releases (SGLang's or vLLM's) are swapped for hard links to one
# copy in the store (CI's 16 release folders: 11.7 GB -> 4.5 GB). The loader targets name `.installed`
# too: reached only through this rule, make would delete it as a by-product.
$(BUILD)/%/.linked: $(BUILD)/%/.installed
	$(BIN)/python -m draftdoctor.realload.linkstore $(RELEASE_STORE) $(@D)
	touch $@

# The real-loader tests need CI's releases (they fail, not skip, in CI without them).
TEST_NEEDS += sglang-loaders
