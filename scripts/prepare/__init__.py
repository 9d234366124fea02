"""The parts of scripts/prepare_data.py: sources (inputs and their chunks), tokenize (tokenizers,
chat rendering, workers), output (shards, manifest, resume)."""


class InputError(Exception):
    """Bad input: the message names the file and the line (or row)."""
