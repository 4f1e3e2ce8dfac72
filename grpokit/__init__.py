"""grpokit: GRPO fine-tuning of language models on tasks whose answers a program can check."""

__version__ = "0.1.0"
