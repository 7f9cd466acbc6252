"""The policy and its backends: the base models, the hf, vllm and openai engines, and the check that vLLM serves the
adapter."""
