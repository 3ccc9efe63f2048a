"""Data that run time, benches and training share: the corpus split, prompt sets, and the answer-store format."""
