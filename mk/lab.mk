# JupyterLab for interactive use (make lab) and the browser its test drives (make browser).
.PHONY: lab browser lab-screenshot

# Debian's Chromium, driven by Playwright (installed by make setup) with an explicit path:
# Playwright's own browser download does not work on closed networks.
CHROMIUM ?= /usr/bin/chromium
APT_GET := $(if $(filter 0,$(shell id -u)),,sudo -n) env DEBIAN_FRONTEND=noninteractive apt-get

# JupyterLab on 127.0.0.1 (LAB_PORT, default a free port) with its state under build/state; prints the
# address with its token.
lab: setup
	$(BIN)/python -m draftdoctor.lab --root $(CURDIR) --log $(BUILD)/lab.log $(if $(LAB_PORT),--port $(LAB_PORT))

# The browser test needs Chromium: installed here with apt-get (root, or passwordless sudo). Where that
# is impossible outside CI, make test goes on and the test skips, saying how to get it; in CI, or asked for
# by name (`make browser`), it fails.
browser:
	@test -x $(CHROMIUM) || { $(APT_GET) update -q && $(APT_GET) install -y -q --no-install-recommends chromium; } \
	|| { echo "make browser: could not install chromium with apt-get (needs root or passwordless sudo)" >&2; \
	     test "$(CI)" != true || exit 1; \
	     test "$(FOR_TESTS)" = 1 || exit 1; \
	     echo "make browser: going on without it; the browser test will skip" >&2; }

TEST_NEEDS += browser

# Re-make the README's screenshot of the coverage notebook in JupyterLab (docs/lab-coverage.png).
lab-screenshot: setup browser
	$(BIN)/python -m pytest -q tests/test_lab_browser.py
	cp build/test-artifacts/lab/03-load-coverage.png docs/lab-coverage.png
