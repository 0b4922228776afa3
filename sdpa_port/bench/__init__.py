"""Benchmark a port: eager against SDPA latency and peak memory across sequence lengths.

Only `spec`, `target`, `report` and `cli` are importable without torch; `measure`, `child` and `run` import torch
and transformers when called, so `sdpa-port --help` never pays for them.
"""
