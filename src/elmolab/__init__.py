"""elmolab: pretrain ELMo-style biLMs and probe what their layers know."""

__version__ = "0.1.0"
