"""splitserve: disaggregated prefill/decode LLM serving control plane."""

__version__ = "0.1.0"
