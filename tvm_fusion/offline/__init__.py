"""Offline stage: build candidates here, time them on a device TVM's RPC cannot reach.

``bundle.export_bundle`` writes a directory of compiled models and kernel candidates,
``runner.py`` (TVM's runtime and numpy only, run as a script on the device) checks and
times them, ``bundle.import_measurements`` turns what it verified into tuning records.
Above deploy in the layer order: a bundle holds models built as ``compile`` builds them.
"""

from .bundle import ImportSummary, export_bundle, import_measurements, read_results

__all__ = ["ImportSummary", "export_bundle", "import_measurements", "read_results"]
