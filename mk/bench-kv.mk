# The KV-handoff benchmark (issue 21). Not part of `make test`: it measures, it asserts nothing.
#
# `make bench-kv` starts real `splitserve worker serve --engine vllm` processes (one core each)
# on a generated 22 M-parameter fp32 model (32 KiB of KV per token) and drives them over gRPC
# the way the router does: P/D vs aggregated vs the same-process control at three prompt lengths
# (TTFT, token-1 -> token-2 gap, KV bytes, NIXL transfer time, raw NIXL READ of the same bytes,
# idle CPU per worker), an interference run (steady decodes while long prompts arrive, TPOT
# p50/p99 with and without disaggregation), and the same with the simulated engine. Prints
# Markdown to out/bench-kv.md (raw numbers in out/bench-kv.json), summarised by hand in
# docs/benchmarks.md. Needs .venv-vllm (`make venv-vllm`). About 15 min on an idle 2-core
# machine; much longer when the machine is shared. KVBENCH_ARGS go to the module, e.g.
# `--runs single --lengths 128,2048 --repeat 5`, `--progress-thread`, `--cold`, `--no-huge-pages`,
# `--pull-in-step` (the opt-in in-step KV pull), `--trace` (token 1 -> token 2 milestones per P/D
# request, SPLITSERVE_KV_TRACE), `--runs fresh --fresh-pairs 3` (the first requests on fresh
# decode workers; `--fresh-variants window,read,noread`: with the prefill-side warm-up window,
# without it, without the warm-up READ either; not in the default runs), `--raw-at-handoff` (raw
# READs on the decode worker's core between each Prefill answer and its Decode call), `--mux` (the
# single run's calls as sub-requests of one Multiplex stream per worker, as the router sends
# them; default a gRPC call each, so a Decode pays a call's set-up). The raw NIXL
# READ is made the way vLLM makes it (kvbench.read_like_vllm); tools/nixl_read_methods.py varies
# one thing of it at a time. It is made twice, alternating: into a small buffer every READ
# rewrites (warm) and into a destination as large as the decode worker's KV cache, the block
# slots written longest ago first (cold, as vLLM's block pool hands out blocks; on this VM the
# first write into memory not written for a while is slower, docs/benchmarks.md "Source,
# destination, or memory?"); `--raw-cold-mib N` sizes it, 0 leaves the cold READs out. Since
# 2026-11-27 13:00 the raw reader runs on the decode worker's core (where vLLM's READ copies)
# and its target on the prefill worker's, so that neither dodges nor adds to the decode core's
# load; `--trace` also prints vLLM's READ as its engine sees it (NIXL's post and transfer
# durations, the wait for vLLM's completion check, its descriptors' runs on either side).

KVBENCH_ARGS ?=
# mk/vllm.mk builds the venv; it is read after this file, so name its stamp here.
KVBENCH_VENV ?= .venv-vllm

.PHONY: bench-kv
# pipefail: a failed run ends `make bench-kv` with its status (`| tee` returned tee's 0)
bench-kv: SHELL := /bin/bash
bench-kv: .SHELLFLAGS := -o pipefail -c
bench-kv: $(KVBENCH_VENV)/.installed
	@mkdir -p out
	OMP_NUM_THREADS=1 $(KVBENCH_VENV)/bin/python -m splitserve.worker.vllm_adapter.kvbench \
	  --json out/bench-kv.json $(KVBENCH_ARGS) | tee out/bench-kv.md
