# docs/openai-api.md is generated from the router's request models (issue 18): `make gen`
# rewrites it, `make gen-check` fails when it drifted.
.PHONY: gen-openai-doc openai-doc-check
gen: gen-openai-doc
gen-check: openai-doc-check

gen-openai-doc: $(STAMP)
	$(VENV)/bin/splitserve gen openai-doc

openai-doc-check: $(STAMP)
	$(VENV)/bin/splitserve gen openai-doc --check
