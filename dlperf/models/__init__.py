"""Model factories: torchvision names, ``file.py:factory`` and the built-in GPT."""
