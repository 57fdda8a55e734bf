# draftdoctor fix: speed and memory against cp and the story's load/rename/save script (about 2 min, 2 GB disk).
.PHONY: bench-fix
bench-fix: setup
	$(BIN)/python benchmarks/fix_speed.py
