# SGLang releases for the real loader (draftdoctor.realload): one folder per release under the build
# area, each `pip install --no-deps --target` from a pinned list, sharing the venv's CPU torch.
REALLOAD := lib/draftdoctor/realload
# One pin list per supported release (tests check it matches draftdoctor.realload.SUPPORTED_RELEASES).
SGLANG_RELEASES := $(patsubst $(REALLOAD)/requirements-%.txt,%,$(wildcard $(REALLOAD)/requirements-*.txt))
SGLANG_DIR := $(BUILD)/sglang

.PHONY: sglang-loaders
sglang-loaders: setup $(foreach r,$(SGLANG_RELEASES),$(SGLANG_DIR)/$(r)/.installed)

# The marker is written only after the child's adapter self-check passed in the fresh folder; the venv
# is order-only (its torch is shared, but re-running `make setup` must not reinstall every release).
# The grep refuses pin lists that would bring torch, CUDA/nvidia wheels, sgl-kernel or triton.
# --no-compile: most of transformers/sglang is never imported; the self-check compiles what is.
$(SGLANG_DIR)/%/.installed: $(REALLOAD)/requirements-%.txt | $(VENV)/.setup-done
	! grep -iqE '^(torch|triton|nvidia|sgl[-_]kernel|sglang[-_]kernel|cuda)' $<
	rm -rf $(@D)
	$(BIN)/pip install -q --no-deps --only-binary=:all: --no-compile --target $(@D) -r $<
	PYTHONPATH=$(@D) $(BIN)/python -m draftdoctor.realload.child --release $* \
		>/dev/null 2>$(@D).log || { tail -n 30 $(@D).log; exit 1; }
	touch $@

# The real-loader tests need the releases (they fail, not skip, in CI without them).
test: sglang-loaders
