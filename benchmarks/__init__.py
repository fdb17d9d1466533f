"""Speed and memory, side by side with Hugging Face transformers (docs/benchmarks.md)."""
