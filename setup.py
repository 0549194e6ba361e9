"""tvm-fusion: fusion-aware auto-scheduling for Apache TVM."""

from setuptools import find_packages, setup

# The data folders at the top of the checkout are the source of truth; a wheel carries
# them as tvm_fusion/_data/<folder>/ (tvm_fusion/data.py finds either layout). Tuning
# runs' scratch (tuning_logs/*/candidates/, .lock; see .gitignore) is not shipped.
DATA = {
    "hw_targets": ["*.json"],
    "search_spaces": ["*.json"],
    "tuning_logs": ["*/*.json", "*/*.md", "*/records/*/*.json"],
}

setup(
    name="tvm-fusion",
    version="0.1.0",
    description="Fusion-aware auto-scheduling extension for Apache TVM",
    packages=find_packages(include=["tvm_fusion", "tvm_fusion.*"])
    + [f"tvm_fusion._data.{folder}" for folder in DATA],
    package_dir={f"tvm_fusion._data.{folder}": folder for folder in DATA},
    package_data={f"tvm_fusion._data.{folder}": globs for folder, globs in DATA.items()},
    zip_safe=False,
    python_requires=">=3.10",
    install_requires=[
        "apache-tvm==0.27.0.post1",
        # 0.1.15 segfaults in tvm.ir.save_json of TIR, which kills every MetaSchedule run.
        "apache-tvm-ffi==0.1.14.post1",
        "xgboost-cpu>=2.0",
        "numpy>=1.24",
        "onnx>=1.15",
        "onnxruntime>=1.17",
        # MetaSchedule's worker pool needs both at run time; apache-tvm does not pull them.
        "psutil",
        "cloudpickle",
        # TVM's RPC tracker (`python -m tvm.exec.rpc_tracker`, for tune --rpc-tracker)
        "tornado",
    ],
    # matplotlib: the benchmark harness draws its chart (tests/test_benchmarks.py runs it).
    # cuobjdump + nvdisasm: tests/test_gpu.py reads the SASS of nvcc-built kernels (HMMA).
    # threadpoolctl: benchmarks/roofline.py reports which OpenBLAS kernel runs.
    # pytest-xdist: `make test` runs the suite on two workers, one per core (TVM on 1 thread).
    extras_require={"test": ["pytest>=7", "matplotlib>=3.7", "nvidia-cuda-cuobjdump",
                             "nvidia-cuda-nvdisasm", "nbclient>=0.10", "nbformat>=5.10",
                             "ipykernel>=6.29", "threadpoolctl>=3",
                             "pytest-xdist>=3.5"],
                    # benchmarks/peers.py's second peer (pip install -e '.[bench]')
                    "bench": ["openvino>=2025"]},
    entry_points={"console_scripts": ["tvm-fusion=tvm_fusion.cli:main"]},
)
