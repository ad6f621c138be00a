"""The version of nsysan, in a module of its own: every layer may read it without importing
the package (whose __init__ imports the whole library)."""

__version__ = "0.1.0"
