# llama.cpp for the llamacpp engine: the converter and llama-server of the llama.cpp that the
# pinned llama-cpp-python sdist vendors (vendor/llama.cpp; no other download), built once under the
# build area and rebuilt only when its inputs (the version, the flags) change. A portable CPU build: AVX2 set
# given explicitly (a -march=native build made on an AVX-512 Xeon dies with SIGILL on an AVX2-only EPYC),
# -O1 (the kit's models are tiny: 3 min instead of 12 on 2 cores; -O0 and unity builds where that is safe:
# mk/llamacpp-build.cmake), static, no web UI (its build would download one), only llama-server. The
# converter runs with the venv's python (torch, transformers) plus requirements/llamacpp.txt.
LLAMACPP_PY := 0.3.36
LLAMACPP_DIR := $(BUILD)/llamacpp
LLAMACPP_SRC := $(LLAMACPP_DIR)/src/llama_cpp_python-$(LLAMACPP_PY)
LLAMACPP_CMAKE := -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
	-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
	-DCMAKE_UNITY_BUILD=ON -DCMAKE_PROJECT_INCLUDE=$(CURDIR)/mk/llamacpp-build.cmake

# named by its inputs: another version or other flags is another build
LLAMACPP_BUILT := $(LLAMACPP_DIR)/.built-$(shell { echo '$(LLAMACPP_PY) $(LLAMACPP_CMAKE)'; cat mk/llamacpp-build.cmake; } | sha1sum | cut -c1-12)

.PHONY: llamacpp
llamacpp: $(LLAMACPP_BUILT) $(VENV)/.llamacpp-py-done

$(VENV)/.venv-complete: $(VENV)/.llamacpp-py-done

# after speculators' install: two pip runs must not change one venv at once (make test runs -j3)
$(VENV)/.llamacpp-py-done: $(VENV)/.setup-done requirements/llamacpp.txt | $(VENV)/.speculators-done
	$(BIN)/pip install -q --no-deps -r requirements/llamacpp.txt
	touch $@

# needs only the bare venv's pip (to download the sdist): make test starts it beside the venv's installs
$(LLAMACPP_BUILT): mk/llamacpp-build.cmake | $(VENV)/.created
	rm -rf $(LLAMACPP_DIR)
	mkdir -p $(LLAMACPP_DIR)/src
	$(BIN)/pip download -q --no-deps --no-binary :all: llama-cpp-python==$(LLAMACPP_PY) -d $(LLAMACPP_DIR)/src
	tar -xzf $(LLAMACPP_DIR)/src/llama_cpp_python-$(LLAMACPP_PY).tar.gz -C $(LLAMACPP_DIR)/src
	env -u SOURCE_DATE_EPOCH cmake -S $(LLAMACPP_SRC)/vendor/llama.cpp -B $(LLAMACPP_DIR)/build $(LLAMACPP_CMAKE) \
		> $(LLAMACPP_DIR)/build.log 2>&1 || { tail -n 30 $(LLAMACPP_DIR)/build.log; exit 1; }
	cmake --build $(LLAMACPP_DIR)/build --target llama-server -j 2 >> $(LLAMACPP_DIR)/build.log 2>&1 \
		|| { tail -n 30 $(LLAMACPP_DIR)/build.log; exit 1; }
	$(LLAMACPP_DIR)/build/bin/llama-server --version
	touch $(LLAMACPP_DIR)/.installed $@

# the converter's packages are the venv's (.llamacpp-py-done, in setup); the build needs only the bare venv
EARLY_NEEDS += $(LLAMACPP_BUILT)
