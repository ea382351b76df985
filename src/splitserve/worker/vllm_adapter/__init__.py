"""The vLLM engine backend: `VllmEngine`, its scheduler shim and the tiny test model.

Importing this package does not import vLLM (or torch): the modules that need vLLM import it
themselves, so `splitserve gen tiny-model` and the docs work in a venv without vLLM.
"""
