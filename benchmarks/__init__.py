"""Side-by-side benchmarks of tvm-fusion against its peers: ``python -m benchmarks.run``.

See ``benchmarks/README.md`` for usage and method.
"""
