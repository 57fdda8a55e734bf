# Demo data (data/demo/) and the speculators stack that builds and checks it.
.PHONY: demo-data

# speculators and its pure-Python deps, --no-deps after torch (see requirements/speculators.txt).
$(VENV)/.venv-complete: $(VENV)/.speculators-done

$(VENV)/.speculators-done: $(VENV)/.setup-done requirements/speculators.txt
	$(BIN)/pip install -q --no-deps -r requirements/speculators.txt
	touch $@

# Rebuilds the committed demo target, the two speculators drafts (norm_before_residual false and
# true), the story draft and prompts; byte-identical on rerun (about 7 min on CPU).
demo-data: setup
	$(BIN)/python -m draftdoctor.reference.demo_data data/demo

# Rebuilds data/wide/draft: a speculators draft of hidden 256 (demo_data.WIDE_TARGET), trained against a
# hidden-256 target that is not kept, stored in bf16; the trained matrices on which tests/test_values.py
# proves the value statistics' bounds beyond the demo's size (about 15 min on CPU).
.PHONY: wide-data
wide-data: setup
	$(BIN)/python -m draftdoctor.reference.demo_data --wide data/wide
