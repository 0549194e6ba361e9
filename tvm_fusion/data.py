"""Where the data shipped with tvm-fusion lies: hardware targets, search spaces, logs.

The top-level folders of the source tree (``hw_targets/``, ``search_spaces/``,
``tuning_logs/``) are the source of truth. ``setup.py`` maps them into the package as
``tvm_fusion/_data/<folder>/``, so a wheel carries them; a source checkout (an editable
install, or ``PYTHONPATH`` pointing at the checkout) has no ``_data`` and reads the
folders themselves. This module is the one place that knows both layouts.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

FOLDERS = ("hw_targets", "search_spaces", "tuning_logs")


def data_dir(folder: str) -> Path:
    """The directory of one shipped data folder, in a wheel or in a source checkout.

    Parameters
    ----------
    folder : str
        One of :data:`FOLDERS`.

    Returns
    -------
    pathlib.Path
        ``tvm_fusion/_data/<folder>`` of an installed wheel, else ``<checkout>/<folder>``.
        The path may not exist (a checkout without shipped logs); callers glob it.
    """
    if folder not in FOLDERS:
        raise ValueError(f"unknown data folder {folder!r}; expected one of {FOLDERS}")
    # files() of a package installed from a wheel is a plain directory (not a zip:
    # the package is not zip-safe), so the Traversable is a real path.
    packaged = Path(str(resources.files(__package__) / "_data" / folder))
    if packaged.is_dir():
        return packaged
    return Path(str(resources.files(__package__))).parent / folder


def hw_targets_dir() -> Path:
    """``hw_targets/``: one JSON description per named hardware target."""
    return data_dir("hw_targets")


def search_spaces_dir() -> Path:
    """``search_spaces/``: one JSON schedule space per target family."""
    return data_dir("search_spaces")


def shipped_logs_dir() -> Path:
    """``tuning_logs/``: the tuning logs and cost models shipped per target."""
    return data_dir("tuning_logs")
