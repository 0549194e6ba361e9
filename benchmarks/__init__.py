"""The benchmark suite of tvm-fusion: ``python -m benchmarks <what> [args...]``.

``python -m benchmarks --help`` lists the subcommands; ``benchmarks/README.md`` says what
each measures and where its results go, ``benchmarks/RESULTS.md`` holds the runs.
"""

from pathlib import Path

# Where a tool writes its results when no --out is given: outside the repository, beside
# the model cache. Results enter the repository only as the tables of RESULTS.md.
OUT_ROOT = Path.home() / ".cache" / "tvm-fusion" / "benchmarks"
