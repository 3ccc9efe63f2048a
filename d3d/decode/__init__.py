"""Decoding: the engines behind ``generate``, the speculative round, draft sources, pricing and acceptance."""
