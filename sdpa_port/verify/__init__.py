"""Proving a port: the original and the port loaded inside transformers, same weights, outputs compared.

Imports torch.
"""
