"""``tvm-fusion cost-model train|eval``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ..errors import CostModelError
from ..targets import load_target
from ..compat.fast_import import import_tensor_intrinsics
from .dataset import load_dataset

# .model (xgboost) is imported in the commands that use it: the rest of the CLI,
# `--help` included, does not load xgboost.

def _target_of(logs: list[str], given: str | None):
    """The hardware the records were measured on: --target, else the manifests' target."""
    if given:
        return load_target(given)
    names = set()
    for root in logs:
        for m in Path(root).rglob("manifest.json"):
            try:
                names.add(json.loads(m.read_text())["target"]["name"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
    if len(names) > 1:
        raise CostModelError(f"the log directories hold records of several targets "
                             f"{sorted(names)}; train per target, or pass --target")
    return load_target(names.pop() if names else "host")


def _load(args):
    import_tensor_intrinsics()  # replaying traces may need the tensor intrinsics
    hw = _target_of(args.logs, args.target)
    say = (lambda line: print(line, file=sys.stderr)) if args.verbose else None
    data = load_dataset(args.logs, hw, progress=say)
    print(f"{hw.name}: {data.summary()}")
    return data


def cmd_train(args) -> int:
    from .model import (DEFAULT_ROUNDS, format_metrics, load_model, split_holdout,
                        split_within, train_model)

    if args.split == "within":
        try:
            fraction = float(args.holdout or 0.1)
        except ValueError:
            raise CostModelError(f"--split within holds out a fraction of each workload's "
                                 f"candidates; --holdout must be a number such as 0.1, got "
                                 f"{args.holdout!r}") from None
    base = load_model(args.base) if args.base else None  # fail before reading the logs
    data = _load(args)
    held = None
    if args.split == "within":
        data, held = split_within(data, fraction, seed=args.seed)
        print(f"held out: {len(held)} candidates ({fraction:g} of each workload's); "
              f"training on {len(data)} candidates of {len(data.workloads)} workloads")
    elif args.holdout:
        data, held = split_holdout(data, args.holdout)
        print(f"held out: {len(held)} candidates of {len(held.workloads)} workloads; "
              f"training on {len(data)} candidates of {len(data.workloads)} workloads")
    if base is not None:
        if held is not None:  # the base has seen these: they are not held out from it
            known = np.array([w in base.train_workloads for w in held.workload.tolist()])
            if known.any():
                print(f"{int(known.sum())} held-out candidates of {len(set(held.workload[known]))} "
                      f"workloads were in {args.base}'s training set and are not counted")
                held = held.subset(~known)
        print(f"fine-tuning {args.base} ({base.booster.num_boosted_rounds()} rounds, trained "
              f"on {', '.join(base.meta.get('targets', ()))}) with "
              f"{args.rounds or DEFAULT_ROUNDS} more rounds")
    model = train_model(data, rounds=args.rounds or DEFAULT_ROUNDS, holdout=held,
                        split=args.split, seed=args.seed, base=base)
    path = model.save(args.output)
    print(f"wrote {path} and {path.name}.meta.json")
    print("training set:\n  " + format_metrics(model.meta["metrics"]["train"]).replace("\n", "\n  "))
    if held is not None:
        what = ("held-out candidates of trained workloads (TenSet's within_task split)"
                if args.split == "within" else "held-out workloads")
        print(f"{what}:\n  "
              + format_metrics(model.meta["metrics"]["holdout"]).replace("\n", "\n  "))
    return 0


def cmd_eval(args) -> int:
    from .model import format_metrics, load_model

    model = load_model(args.model)
    data = _load(args)
    seen = model.train_workloads
    mask = np.array([w not in seen for w in data.workload.tolist()], dtype=bool)
    unseen = data.subset(mask)
    print(f"{len(data.workloads) - len(unseen.workloads)} workloads were in the model's "
          f"training set and are left out; evaluating on {len(unseen.workloads)} held-out "
          f"workloads")
    if not len(unseen):
        raise CostModelError(f"every workload in {args.logs} was in {args.model}'s training "
                             "set; evaluate on logs of a model it was not trained on")
    print(format_metrics(model.evaluate(unseen)))
    return 0


def add_parser(sub) -> None:
    """Add ``cost-model`` with ``train`` and ``eval`` to the CLI's subparsers."""
    cm = sub.add_parser("cost-model", help="train or evaluate the learned cost model",
                        description="The pretrained XGBoost ranking model the tuner uses "
                                    "with `tune --cost-model MODEL`.")
    csub = cm.add_subparsers(dest="cm_command", metavar="ACTION", required=True)

    def common(p):
        p.add_argument("--logs", nargs="+", required=True, metavar="DIR",
                       help="tuning log directories (tvm-fusion LOGS dirs or MetaSchedule "
                            "work dirs; searched recursively for JSONDatabase files)")
        p.add_argument("--target", default=None,
                       help="hardware the records were measured on (default: the target "
                            "in the logs' manifests, else host)")
        p.add_argument("-v", "--verbose", action="store_true",
                       help="print each database as it is read")

    tr = csub.add_parser("train", help="train a ranking model from tuning records",
                         description="Replay every measured record, compute its features "
                                     "and train an XGBoost ranker (one group per kernel). "
                                     "Writes MODEL (.json or .ubj) and MODEL.meta.json.")
    common(tr)
    tr.add_argument("-o", "--output", required=True, metavar="MODEL",
                    help="model file to write, .json or .ubj")
    tr.add_argument("--holdout", metavar="FRACTION|PATH_PART",
                    help="keep workloads out of training and report metrics on them: a "
                         "fraction (0.2) of workloads at random, or a substring of database "
                         "paths (ppocr-cls) to hold out one model's kernels")
    tr.add_argument("--split", choices=("workloads", "within"), default="workloads",
                    help="workloads (default): --holdout keeps whole kernels out, the "
                         "question a new model asks. within: hold out the --holdout "
                         "fraction (default 0.1) of every kernel's candidates and train on "
                         "the rest of every kernel, TenSet's default protocol (its "
                         "published reference numbers are within-task); for comparison "
                         "only, since the model then lacks those candidates")
    tr.add_argument("--rounds", type=int, default=None,
                    help="boosting rounds (default: the model's default)")
    tr.add_argument("--base", metavar="MODEL", default=None,
                    help="fine-tune: start from this saved model (e.g. another machine's "
                         "shipped one) and add --rounds trees fitted to these records; its "
                         "training workloads count as seen (not held out, not evaluated)")
    tr.add_argument("--seed", type=int, default=0)
    tr.set_defaults(func=cmd_train)

    ev = csub.add_parser("eval", help="ranking metrics of a model on held-out workloads",
                         description="Pairwise ranking accuracy and top-1/top-5 peak score "
                                     "(TenSet's definitions) on the workloads of --logs "
                                     "that the model was not trained on.")
    ev.add_argument("model", metavar="MODEL", help="a model written by `cost-model train`")
    common(ev)
    ev.set_defaults(func=cmd_eval)


    gm = sub.add_parser("train-group-model", help="train the learned group-latency model "
                        "the planner can price kernels with",
                        description="Pair every measured kernel of the logs with its plan "
                                    "group and fit log(measured / analytical) with XGBoost. "
                                    "Writes FILE (.json or .ubj) and FILE.meta.json. Use it "
                                    "with `plan --group-model FILE`.")
    gm.add_argument("--logs", nargs="+", required=True, metavar="DIR",
                    help="tuning-log target directories written by `tvm-fusion tune`, or "
                         "directories of them")
    gm.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="model file to write, .json or .ubj")
    gm.add_argument("--rounds", type=int, default=None,
                    help="boosting rounds (default: the model's default)")
    gm.set_defaults(func=cmd_train_group_model)


def cmd_train_group_model(args) -> int:
    """``tvm-fusion train-group-model --logs DIR... -o FILE``."""
    from ..logs.tools import target_dirs
    from .group_data import kernel_records
    from .group_model import ROUNDS, train_group_model

    out = Path(args.output)
    if out.suffix not in (".json", ".ubj") or not out.parent.is_dir():
        raise CostModelError(f"-o {out}: expected a .json or .ubj file in an existing "
                             "directory")
    dirs = [t for d in args.logs
            for t in target_dirs(Path(d), manifest_only=True, missing_ok=True)]
    if not dirs:
        raise CostModelError(f"--logs {' '.join(args.logs)}: no manifest.json in them or "
                             "their subdirectories; pass directories written by "
                             "`tvm-fusion tune`")
    records = [r for t in dirs for r in kernel_records(t)]  # untuned ones: counted
    model = train_group_model(records, rounds=args.rounds or ROUNDS)
    model.save(out)
    for t in model.meta["targets"].values():
        print(f"{t['name']}: {t['records']} measured kernels")
    print(f"group model written to {out} (use it as `plan --group-model {out}`)")
    return 0


def add_group_model_flag(p: argparse.ArgumentParser) -> None:
    """The ``--group-model`` flag of ``plan`` and ``tune``."""
    p.add_argument("--group-model", metavar="FILE|auto|none", default="none",
                   help="price the kernels of a fresh plan with a learned group-latency "
                        "model (`train-group-model`) where it has enough records of the "
                        "target, the analytical model elsewhere; the plan's reasons say "
                        "which. auto: $TVM_FUSION_GROUP_MODEL, else the model shipped in "
                        "tuning_logs/group_model.json, else none. none (default: held out "
                        "model by model, the learned times cut the median error on 4 of 5 "
                        "x86 models but lower the rank correlation on 2, and no model "
                        "ships: benchmarks/results-group-model.json): the analytical model")


def group_model_of(value: str | None):
    """The group model ``--group-model`` names (None for ``none``, or ``auto`` with no
    model to find)."""
    if value in (None, "none"):
        return None
    from .group_model import find_group_model, load_group_model

    if value == "auto":
        value = find_group_model()
    return None if value is None else load_group_model(value)


def add_tune_flag(p: argparse.ArgumentParser) -> None:
    """The ``--cost-model`` flag of ``tune``."""
    p.add_argument("--cost-model", metavar="MODEL|auto|none", default="auto",
                   help="a pretrained model (`cost-model train`) in place of MetaSchedule's "
                        "XGBoost model; it keeps learning from this run's measurements, and "
                        "kernels the budget does not reach get the schedule it ranks best "
                        "(verified). auto (default): the model shipped for this hardware "
                        "(tuning_logs/<target>/costmodel.json, matched by TVM target; "
                        "$TVM_FUSION_COST_MODEL overrides), else none. none: MetaSchedule's "
                        "XGBoost model from scratch")
