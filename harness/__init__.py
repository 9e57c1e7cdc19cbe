"""stq-metal harness: pinned llama.cpp source, patch stack, builds, models, server control."""

__version__ = "0.1.0"
