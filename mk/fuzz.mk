# Fuzzing the router's HTTP edge (issue 12 item 6). CI runs tests/fuzz at a small size as part of
# `make test` (FUZZ_EXAMPLES defaults to 40 per route); `make fuzz` runs the full size and writes
# the status counts to out/fuzz.json (summarised by hand in docs/reliability.md).

FUZZ_EXAMPLES ?= 2000

.PHONY: fuzz

fuzz: $(STAMP)
	@mkdir -p out
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_REPORT=out/fuzz.json \
	  $(PY) -m pytest -q -s -p no:cacheprovider tests/fuzz --timeout 3600
