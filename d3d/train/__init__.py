"""Training: corpus handling, BPE tokenizer training, target pretraining, drafter training."""
