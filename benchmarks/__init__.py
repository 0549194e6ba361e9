"""Side-by-side benchmarks of tvm-fusion against its peers: ``python -m benchmarks.run``.

See ``benchmarks/README.md`` for usage and method.

Importing this package sizes TVM's thread pool as tvm-fusion's entry points do
(:func:`tvm_fusion.config.use_all_cores`: every core, unpinned, unless
``TVM_NUM_THREADS`` is set): the probes here time TVM kernels of their own, outside those
entry points, and must run them as tvm-fusion runs its kernels.
"""

from tvm_fusion.config import use_all_cores

use_all_cores()
