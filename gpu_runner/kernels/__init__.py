"""Attention over the paged KV cache. reference.py: torch implementations (the CPU engine
path and the ground truth for the Triton kernels)."""
