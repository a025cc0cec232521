"""InferenceEngine interface and engines: embedded CPU, OpenAI-compatible, vLLM (issue M3)."""
