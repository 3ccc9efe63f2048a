"""The model: configuration, the Qwen3/Qwen2 transformer, its KV cache, checkpoints (HF and GGUF) and the tokenizer."""
