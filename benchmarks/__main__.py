"""``python -m benchmarks <what> [args...]``: the one entry point of the benchmark suite.

Each subcommand is one module of ``benchmarks/`` and runs that module's ``main`` with the
rest of the command line, exactly as ``python -m benchmarks.<module> [args...]`` does (that
form keeps working, so the commands recorded in ``benchmarks/RESULTS.md`` still run).
``python -m benchmarks --help`` lists the subcommands with the first line of each module's
docstring; ``python -m benchmarks <what> --help`` gives that tool's options. The listing
reads the docstrings from the source files, so it imports neither TVM nor the tools.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# subcommand -> module of benchmarks/, in the order the listing shows them
COMMANDS = {
    "perf": "perf",
    "peers": "peers",
    "run": "run",
    "coverage": "coverage",
    "planner": "planner_accuracy",
    "plan-audit": "plan_audit",
    "group-model": "group_model",
    "same-records": "same_records",
    "kernels": "kernel_table",
    "int8": "int8_bench",
    "simplify": "simplify",
    "pretrained": "pretrained",
    "gpu-resources": "gpu_resources",
    "h200": "h200",
}

USAGE = "usage: python -m benchmarks <what> [args...]   (python -m benchmarks <what> --help)"


def summary(module: str) -> str:
    """The one-line description of a tool: the first paragraph of its module docstring.

    Parameters
    ----------
    module : str
        The module's name in ``benchmarks/`` (``"kernel_table"``).

    Returns
    -------
    str
        The paragraph on one line, with a leading or trailing ````python -m ...````
        usage span left out (the subcommand's ``--help`` gives the usage).
    """
    doc = ast.get_docstring(ast.parse((HERE / f"{module}.py").read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r"^``[^`]*``:\s*", "", text)
    text = re.sub(r":\s*``[^`]*``\.?$", ".", text)
    return text if text.startswith("tvm-fusion") else text[:1].upper() + text[1:]


def listing() -> str:
    """The ``--help`` text: the usage line and one line per subcommand.

    Returns
    -------
    str
        The text, ending in a newline.
    """
    width = max(map(len, COMMANDS))
    lines = [USAGE, "", "The benchmark suite of tvm-fusion; benchmarks/README.md says what "
             "each measures and where its results go.", "", "what:"]
    lines += [f"  {name:<{width}}  {summary(module)}" for name, module in COMMANDS.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand.

    Parameters
    ----------
    argv : list of str, optional
        The command line after ``python -m benchmarks`` (default ``sys.argv[1:]``): the
        subcommand, then its own arguments.

    Returns
    -------
    int
        The exit status: the tool's (0 where its ``main`` returns None), 0 for
        ``--help``, 2 for a missing or unknown subcommand.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"], ["help"]):
        sys.stdout.write(listing())
        return 0
    if not argv or argv[0] not in COMMANDS:
        what = f"unknown subcommand {argv[0]!r}" if argv else "no subcommand given"
        sys.stderr.write(f"{USAGE}\npython -m benchmarks: {what}; one of: "
                         f"{', '.join(COMMANDS)}\n")
        return 2
    name, rest = argv[0], argv[1:]
    tool = importlib.import_module(f"benchmarks.{COMMANDS[name]}")
    # argparse names the program after sys.argv[0]; a tool that reads sys.argv itself
    # sees its own arguments, as under ``python -m benchmarks.<module>``
    sys.argv = [f"python -m benchmarks {name}", *rest]
    status = tool.main(rest)
    return 0 if status is None else int(status)


if __name__ == "__main__":
    raise SystemExit(main())
