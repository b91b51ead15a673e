"""The generator's version: in the headers it renders, the cache and tuning keys, and --version."""
__version__ = "0.1.0"
