"""The package version, in a module of its own so that any stage can read it without
importing the public API in ``tvm_fusion/__init__.py`` (which imports every stage)."""

__version__ = "0.1.0"
