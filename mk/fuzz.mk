# Longer fuzzing of the header reader than CI's 10,000 cases.
FUZZ_EXAMPLES ?= 200000

.PHONY: fuzz
fuzz: setup
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/test_robustness.py
