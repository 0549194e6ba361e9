"""The benchmark suite of tvm-fusion: ``python -m benchmarks <what> [args...]``.

``python -m benchmarks --help`` lists the subcommands; ``benchmarks/README.md`` says what
each measures and where its results go, ``benchmarks/RESULTS.md`` holds the runs.

Importing this package sizes TVM's thread pool as tvm-fusion's entry points do
(:func:`tvm_fusion.config.use_all_cores`: every core, unpinned, unless
``TVM_NUM_THREADS`` is set): the probes here time TVM kernels of their own, outside those
entry points, and must run them as tvm-fusion runs its kernels.
"""

from pathlib import Path

from tvm_fusion.config import use_all_cores

use_all_cores()

# Where a tool writes its results when no --out is given: outside the repository, beside
# the model cache. Results enter the repository only as the tables of RESULTS.md.
OUT_ROOT = Path.home() / ".cache" / "tvm-fusion" / "benchmarks"
