"""One error family for everything tvm-fusion reports to a user.

Every message says what was expected, what was got, and how to fix it.
"""

from __future__ import annotations


class TvmFusionError(Exception):
    """Base class of every error tvm-fusion raises on purpose."""


class ModelImportError(TvmFusionError):
    """The model file could not be read or converted to Relax."""


class MissingShapeError(ModelImportError):
    """A model input has a dynamic dimension and no ``--shape`` was given for it."""


class UnsupportedOpError(ModelImportError):
    """The model uses operators that TVM's importer cannot convert."""


class LoweringError(TvmFusionError):
    """TVM cannot lower one kernel of the plan for the target (``kernel``: its name)."""

    def __init__(self, message: str, kernel: str = ""):
        super().__init__(message)
        self.kernel = kernel


class TargetError(TvmFusionError):
    """An unknown target name or a malformed hardware description."""


class PlanError(TvmFusionError):
    """A fusion plan that does not fit the model it is applied to."""


class LogError(TvmFusionError):
    """A tuning log directory that cannot be used as asked."""


class ExportError(TvmFusionError):
    """A compiled module that cannot be written where it was asked to go."""


class ModuleLoadError(TvmFusionError):
    """A compiled module that cannot be loaded or called with the given inputs."""


class CostModelError(TvmFusionError):
    """A cost model file that cannot be used, or training data that cannot train one."""


class OptionError(TvmFusionError, ValueError):
    """An option (:class:`~tvm_fusion.PlanOptions`, :class:`~tvm_fusion.SearchOptions`)
    with a value it cannot take. ``field`` names it, ``allowed`` says what it takes."""

    def __init__(self, message: str, *, field: str = "", allowed: str = ""):
        super().__init__(message)
        self.field = field
        self.allowed = allowed
