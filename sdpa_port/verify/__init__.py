"""Proving a port: load original and ported modules inside transformers, copy weights, compare (imports torch)."""
