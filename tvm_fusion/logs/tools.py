"""Tools over tuning log directories: show, merge, validate, prune (``tvm-fusion logs``).

A log directory holds one sub-directory per target (``LOGS/<target>/``); every tool also
accepts such a target directory itself. Each function returns plain data (dicts and
lists, JSON-ready) and the CLI prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import warnings
from pathlib import Path

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from ..errors import LogError, TvmFusionError
from ..targets import load_target
from .logdb import (PREDICTED_RUN_S, RECORD_FILE, WORKLOAD_FILE, DirLock, LogDatabase,
                    write_database)
from .manifest import (Manifest, load_manifest, load_manifest_raw, manifest_problems,
                       target_key, write_manifest)


def target_dirs(root: str | Path, *, manifest_only: bool = False,
                missing_ok: bool = False) -> list[Path]:
    """The target directories of a log directory (or ``root`` itself if it is one).

    Parameters
    ----------
    root : path
        A tuning log directory (``LOGS``, holding ``LOGS/<target>/``) or one target
        directory of it.
    manifest_only : bool
        Count only target directories with a ``manifest.json`` (what the group data and
        the efficiency fit read), not those with MetaSchedule's workload file alone (what
        ``tvm-fusion logs`` shows, merges and prunes).
    missing_ok : bool
        Return ``[]`` for a ``root`` that is no directory or holds no target directory,
        for callers that scan several and say themselves when all were empty.

    Returns
    -------
    list of Path
        ``[root]`` when it is a target directory, else its target subdirectories, sorted.

    Raises
    ------
    LogError
        Without ``missing_ok``: ``root`` is no directory or holds no tuning logs.
    """
    root = Path(root)
    if not root.is_dir():
        if missing_ok:
            return []
        raise LogError(f"{root} is not a directory; expected a tuning log directory "
                       "(LOGS, holding LOGS/<target>/) written by `tvm-fusion tune`")

    def is_target(p: Path) -> bool:
        return (p / "manifest.json").exists() or (
            not manifest_only and (p / WORKLOAD_FILE).exists())

    if is_target(root):
        return [root]
    found = sorted(p for p in root.iterdir() if p.is_dir() and is_target(p))
    if not found and not missing_ok:
        raise LogError(f"{root} holds no tuning logs (no <target>/manifest.json or "
                       f"<target>/{WORKLOAD_FILE} in it)")
    return found


def _load(tdir: Path, *, warn: bool = False) -> LogDatabase:
    with warnings.catch_warnings():
        if not warn:
            warnings.simplefilter("ignore")
        return LogDatabase(tdir, writable=False, warn=warn)


def _mean_us(record) -> float | None:
    """Mean time of a record; None for a dry run's pick, which no device has run."""
    secs = [float(s) for s in record.run_secs]
    if all(s == PREDICTED_RUN_S for s in secs):
        return None
    return sum(secs) / len(secs) * 1e6


def _rank_us(record) -> float:
    """A record's time for ranking: a dry run's unmeasured pick after every measurement."""
    us = _mean_us(record)
    return float("inf") if us is None else us


def _users(manifest: Manifest | None) -> tuple[dict[str, list[dict]], bool]:
    """workload key -> [{model, kernel, calls}], and whether every model has a kernel table."""
    users: dict[str, list[dict]] = {}
    complete = True
    for h, entry in (manifest.models if manifest else {}).items():
        if entry.kernels is None:
            complete = False
            continue
        label = entry.label(h)
        for name, k in entry.kernels.items():
            users.setdefault(k.workload, []).append(
                {"model": label, "kernel": name, "calls": 1 if k.calls is None else k.calls})
    return users, complete


# ---- show -----------------------------------------------------------------------------

def show(root: str | Path) -> list[dict]:
    """Per target: identity, versions, models, and per workload its records and best time.

    Returns
    -------
    list of dict
        One dict per target directory (JSON-ready).
    """
    out = []
    for tdir in target_dirs(root):
        m = load_manifest(tdir)
        db = _load(tdir)
        users, complete = _users(m)
        workloads = []
        for wl in db.workloads():
            key = db.workload_key(wl)
            recs = db.records_of(wl)
            workloads.append({
                "workload": key, "records": len(recs),
                "best_us": _mean_us(recs[0]) if recs else None,
                "unmeasured": bool(recs) and _mean_us(recs[0]) is None,
                "used_by": users.get(key, [])})
        cand = tdir / "candidates"
        candidates = None
        if (cand / WORKLOAD_FILE).exists():
            candidates = _load(cand).record_lines
        out.append({
            "target_dir": str(tdir),
            "target": m.target if m else None,
            "versions": {k: getattr(m, k) if m else None
                         for k in ("schema", "version", "tvm", "tvm_fusion")},
            "models": [{"hash": h, "label": e.label(h), "source": e.source,
                        "inputs": e.to_json()["inputs"], "plan_hash": e.plan_hash,
                        "planner": e.plan.get("planner"),
                        "kernels": None if e.kernels is None else len(e.kernels),
                        "trials": e.trials}
                       for h, e in (m.models if m else {}).items()],
            "workloads": workloads, "records": len(db),
            "skipped_lines": [vars(b) for b in db.bad_lines],
            "candidates_measured": candidates,
            "kernel_tables_complete": complete,
        })
    return out


def format_show(report: list[dict]) -> str:
    """The text ``tvm-fusion logs show`` prints."""
    lines = []
    for t in report:
        tgt = t["target"] or {}
        v = t["versions"]
        lines.append(f"{t['target_dir']}: target {tgt.get('name', '?')} "
                     f"{tgt.get('key') or json.dumps(tgt.get('tvm'))} hardware "
                     f"{str(tgt.get('hardware_hash'))[:12]}; TVM {v['tvm']}, tvm-fusion "
                     f"{v['tvm_fusion']}, manifest {v['schema']} v{v['version']}")
        for mdl in t["models"]:
            lines.append(f"  model {mdl['label']}: plan {mdl['plan_hash']} "
                         f"({mdl['planner']}, {mdl['kernels'] if mdl['kernels'] is not None else '?'}"
                         f" kernels), {mdl['trials']} trials")
        cand = (f", {t['candidates_measured']} candidates measured"
                if t["candidates_measured"] is not None else "")
        guessed = sum(bool(w.get("unmeasured")) for w in t["workloads"])
        guessed = f" ({guessed} best picked by --dry-run, not measured)" if guessed else ""
        lines.append(f"  {len(t['workloads'])} workloads, {t['records']} verified records"
                     f"{guessed}{cand}")
        lines.append(f"  {'workload':<22} {'records':>7} {'best us':>10}  kernel (model)")
        for w in t["workloads"]:
            best = (f"{w['best_us']:10.2f}" if w["best_us"] is not None
                    else f"{'predicted':>10}" if w.get("unmeasured") else f"{'-':>10}")
            used = "; ".join(f"{u['kernel']} x{u['calls']} ({u['model']})" for u in w["used_by"])
            if not used:
                used = ("no model in the manifest" if t["kernel_tables_complete"]
                        else "unknown (manifest predates kernel tables)")
            lines.append(f"  {w['workload']:<22} {w['records']:>7} {best}  {used}")
        if t["skipped_lines"]:
            lines.append(f"  {len(t['skipped_lines'])} unreadable lines skipped (run "
                         "`tvm-fusion logs validate` for details, `logs prune` to drop them)")
    return "\n".join(lines)


# ---- merge ----------------------------------------------------------------------------

def _hash_aliases(name: str) -> dict[str, str]:
    """Earlier hashes of the description ``name`` (re-measured, or the all-values hash of
    logs keyed before the hardware hash left out the calibrated numbers) -> its hash now;
    empty for a name that is no known target."""
    try:
        hw = load_target(name)
    except TvmFusionError:
        return {}
    return {h: hw.hardware_hash for h in hw.previous_hashes}


def merge(sources: list[str | Path], dest: str | Path) -> list[dict]:
    """Merge log directories into ``dest``, keeping the best record per workload.

    Target directories of the same name must describe the same target (same target key
    and hardware hash) and the same TVM and manifest version as this tvm-fusion;
    anything else is refused before anything is written. ``dest`` may already hold logs:
    they take part in the merge. Only verified records are merged (``candidates/``,
    the search history, stays with each source).

    Returns
    -------
    list of dict
        Per target: the sources, records in and out, models, plan conflicts.
    """
    dest = Path(dest)
    groups: dict[str, list[Path]] = {}
    for src in sources:
        for tdir in target_dirs(src):
            groups.setdefault(tdir.name, []).append(tdir)
    if dest.exists() and any(dest.iterdir()):
        for tdir in target_dirs(dest):
            groups.setdefault(tdir.name, []).insert(0, tdir)
    # check everything before writing anything
    manifests: dict[str, list[tuple[Path, dict | None]]] = {}
    for name, tdirs in groups.items():
        seen = []
        for tdir in tdirs:
            m = load_manifest_raw(tdir)
            if m is not None:
                version, _ = manifest_problems(m, tdir)
                if version:
                    raise LogError(f"cannot merge: {version[0]}")
            seen.append((tdir, m))
        idents = {}
        same = _hash_aliases(name)
        for tdir, m in seen:
            t = (m or {}).get("target")
            if t is not None:
                h = t.get("hardware_hash")
                idents[tdir] = (t.get("key") or target_key(t.get("tvm", {})), same.get(h, h))
        if len(set(idents.values())) > 1:
            desc = "; ".join(f"{p}: {k} hardware {str(h)[:12]}" for p, (k, h) in idents.items())
            raise LogError(f"refusing to merge records of different targets under the name "
                           f"{name!r} ({desc}); records of one target must not be applied on "
                           "another. Merge them into separate directories, or rename one "
                           "target directory if it really is another target")
        manifests[name] = seen
    report = []
    for name, seen in manifests.items():
        report.append(_merge_target(name, seen, dest / name))
    return report


def _merge_target(name: str, seen, out: Path) -> dict:
    mem = ms.database.MemoryDatabase()
    best: dict = {}   # canonical workload -> best record
    order: list = []
    records_in = skipped = 0
    for tdir, _ in seen:
        if not (tdir / WORKLOAD_FILE).exists():
            continue
        db = _load(tdir)
        skipped += len(db.bad_lines)
        for wl in db.workloads():
            canon = mem.commit_workload(wl.mod)
            if canon not in best:
                best[canon] = None
                order.append(canon)
            recs = db.records_of(wl)
            records_in += len(recs)
            if recs and (best[canon] is None or _rank_us(recs[0]) < _rank_us(best[canon])):
                best[canon] = recs[0]
    entries = []
    for canon in order:
        rec = best[canon]
        recs = [] if rec is None else [ms.database.TuningRecord(
            rec.trace, canon, rec.run_secs, rec.target, rec.args_info)]
        entries.append((canon, recs))
    manifest, conflicts = None, []
    for tdir, raw in seen:
        if raw is None:
            continue
        m = Manifest.from_json(raw)
        if manifest is None:
            manifest = dataclasses.replace(m, models={})
        for h, e in m.models.items():
            have = manifest.entry(h)
            if have is not None and have.plan_hash != e.plan_hash:
                conflicts.append(f"model {e.label(h)}: plans {have.plan_hash} "
                                 f"and {e.plan_hash}; kept the one with more trials")
                if e.trials <= have.trials:
                    continue
            elif have is not None:
                e = dataclasses.replace(e, trials=max(e.trials, have.trials))
            manifest = manifest.with_model(h, e)
    out.mkdir(parents=True, exist_ok=True)
    with DirLock(out, exclusive=True):
        write_database(out, entries)
        if manifest is not None:
            write_manifest(out, manifest)
    return {"target": name, "sources": [str(t) for t, _ in seen], "dest": str(out),
            "records_in": records_in, "skipped_lines": skipped,
            "workloads": len(entries), "records_out": sum(len(r) for _, r in entries),
            "models": sorted(manifest.models if manifest else {}), "conflicts": conflicts}


# ---- validate -------------------------------------------------------------------------

def validate(root: str | Path, *, build: bool = False,
             allow_other_target: bool = False) -> list[dict]:
    """Check every target directory: versions, target, plans, and every best record.

    Each workload's stored hash is recomputed with this TVM (a different hash means the
    workload would no longer be found: stale); its best record's trace is replayed on
    the workload (and with ``build``, the result is compiled); records whose target is
    not the manifest's are flagged, and so are unreadable lines.

    Returns
    -------
    list of dict
        Per target: ``problems`` (each makes ``logs validate`` exit non-zero),
        ``notes`` (informational), and counts.
    """
    out = []
    for tdir in target_dirs(root):
        problems, notes = [], []
        m = load_manifest(tdir)
        if m is None:
            problems.append(f"{tdir}: no manifest.json, so versions and target cannot be "
                            "checked")
        else:
            hw = None
            try:
                hw = load_target(tdir.name)
            except Exception as e:  # a target name this installation does not know
                notes.append(f"target {tdir.name!r} is not known here ({e}); target not "
                             "compared with this machine")
            version, target = manifest_problems(m, tdir, hw)
            problems += version
            (notes if allow_other_target else problems).extend(target)
            for h, e in m.models.items():
                try:
                    e.fusion_plan()
                except Exception as err:  # PlanError or a malformed entry
                    problems.append(f"model {e.label(h)}: stored plan is broken: "
                                    f"{err}")
        for name in (WORKLOAD_FILE, RECORD_FILE):
            if (tdir / f"{name}.bak").exists():
                problems.append(f"{tdir / (name + '.bak')} exists: a merge or prune was "
                                "interrupted; check the database and delete the .bak file")
        db = _load(tdir)
        for b in db.bad_lines:
            problems.append(f"{tdir / b.file} line {b.line}: broken: {b.reason}")
        stored_target = (m.target if m else None) or {}
        want = (json.loads(stored_target.get("key") or target_key(stored_target.get("tvm", {})))
                if stored_target else None)
        users, complete = _users(m)
        checked = 0
        for wl in db.workloads():
            key = db.workload_key(wl)
            now = str(tvm_ffi.structural_hash(wl.mod))
            if now != key:
                problems.append(f"workload {key}: stale: this TVM hashes it as {now}, so "
                                "its records would never be found; re-tune")
            recs = db.records_of(wl)
            if not recs:
                if users.get(key):
                    notes.append(f"workload {key} ({_kernels(users[key])}): no record; "
                                 "compile gives it the default schedule")
                continue
            rec = recs[0]
            checked += 1
            if want is not None and rec.target is not None:
                got = _target_dict(rec.target)
                diff = [k for k in ("kind", "mcpu", "arch") if k in want and got.get(k) != want[k]]
                if diff:
                    problems.append(f"workload {key}: best record was tuned for "
                                    f"{ {k: got.get(k) for k in diff} }, the manifest's target "
                                    f"is { {k: want[k] for k in diff} }")
            try:
                sch = tvm.s_tir.Schedule(wl.mod)
                rec.trace.apply_to_schedule(sch, remove_postproc=False)
                if build:
                    tgt = rec.target or tvm.target.Target(want or {"kind": "llvm"})
                    tvm.tirx.build(sch.mod, target=tgt)
            except Exception as err:  # TVM errors of a stale trace or a failing build
                problems.append(f"workload {key}: best record is broken: "
                                f"{'build' if build else 'replay'} fails: "
                                f"{_last_line(err)}")
            if complete and m is not None and not users.get(key):
                notes.append(f"workload {key}: no model in the manifest uses it "
                             "(`logs prune` drops it)")
        for key, us in users.items():
            if not any(db.workload_key(wl) == key for wl in db.workloads()):
                problems.append(f"{_kernels(us)}: its workload {key} is missing from the "
                                "database; re-tune the model")
        out.append({"target_dir": str(tdir), "problems": problems, "notes": notes,
                    "workloads": len(db.workloads()), "best_records_checked": checked})
    return out


def _kernels(users: list[dict]) -> str:
    return ", ".join(f"{u['kernel']} of {u['model']}" for u in users)


def _target_dict(target) -> dict:
    return {k: (str(v) if not isinstance(v, (int, float, bool)) else v)
            for k, v in target.export().items()}


def _last_line(err: Exception) -> str:
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    return lines[-1][:300] if lines else type(err).__name__


# ---- prune ----------------------------------------------------------------------------

def prune(root: str | Path) -> list[dict]:
    """Keep only the best record per workload and drop workloads no model uses.

    Unreadable lines go too. Workloads are dropped only when every model of the
    manifest lists its kernels (manifests written before kernel tables keep all).
    ``candidates/`` (the search history) is left alone.

    Returns
    -------
    list of dict
        Per target: workloads and records before and after, lines dropped.
    """
    out = []
    for tdir in target_dirs(root):
        m = load_manifest(tdir)
        if m is not None:
            version, _ = manifest_problems(m, tdir)
            if version:
                raise LogError(f"cannot prune: {version[0]}")
        users, complete = _users(m)
        with DirLock(tdir, exclusive=True):
            db = _load(tdir)
            entries, dropped_wl = [], 0
            for wl in db.workloads():
                key = db.workload_key(wl)
                if complete and m is not None and key not in users:
                    dropped_wl += 1
                    continue
                entries.append((wl, db.records_of(wl)[:1]))
            before = (len(db.workloads()), len(db), len(db.bad_lines))
            write_database(tdir, entries)
        out.append({"target_dir": str(tdir), "workloads_before": before[0],
                    "records_before": before[1], "bad_lines_dropped": before[2],
                    "workloads_after": len(entries),
                    "records_after": sum(len(r) for _, r in entries),
                    "unused_workloads_dropped": dropped_wl,
                    "note": None if complete else "some models in the manifest have no kernel "
                            "table (tuned before it existed): no workload was dropped"})
    return out


__all__ = ["format_show", "merge", "prune", "show", "target_dirs", "validate"]


# ---- command line ---------------------------------------------------------------------

def add_parser(sub) -> None:
    """Add ``tvm-fusion logs show|merge|validate|prune`` to the CLI's sub-parsers."""
    lg = sub.add_parser("logs", help="inspect, merge, validate and prune tuning logs",
                        description="Tools over tuning log directories (LOGS, holding one "
                                    "LOGS/<target>/ per target; a target directory itself "
                                    "is accepted too).")
    ls = lg.add_subparsers(dest="logs_command", metavar="ACTION", required=True)
    s = ls.add_parser("show", help="per target: versions, models, workloads, records, best "
                                   "latency per kernel and which models use it")
    s.add_argument("dir", metavar="DIR")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=_cmd_show)
    m = ls.add_parser("merge", help="merge log directories, keeping the best record per "
                                    "workload; refuses to mix targets",
                      description="Merge SRC log directories into DST (whose own logs take "
                                  "part), keeping the best verified record per workload. "
                                  "Target directories of the same name must be the same "
                                  "target (key and hardware hash) and TVM version.")
    m.add_argument("sources", nargs="+", metavar="SRC")
    m.add_argument("-o", "--output", required=True, metavar="DST")
    m.set_defaults(func=_cmd_merge)
    v = ls.add_parser("validate", help="replay every best record, check versions, target "
                                       "and hashes; exit 1 on any stale or broken record",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("dir", metavar="DIR")
    v.add_argument("--build", action="store_true",
                   help="also compile each replayed best record")
    v.add_argument("--allow-other-target", action="store_true",
                   help="report a target other than this machine's as a note, not a problem")
    v.add_argument("--json", action="store_true", help="print JSON")
    v.set_defaults(func=_cmd_validate)
    p = ls.add_parser("prune", help="keep only the best record per workload; drop workloads "
                                    "no model in the manifest uses, and unreadable lines")
    p.add_argument("dir", metavar="DIR")
    p.set_defaults(func=_cmd_prune)


def _cmd_show(args) -> int:
    report = show(args.dir)
    print(json.dumps(report, indent=1) if args.json else format_show(report))
    return 0


def _cmd_merge(args) -> int:
    for t in merge(args.sources, args.output):
        print(f"{t['target']}: {t['records_in']} records from {len(t['sources'])} "
              f"director{'y' if len(t['sources']) == 1 else 'ies'} -> {t['records_out']} "
              f"best records of {t['workloads']} workloads in {t['dest']} "
              f"({len(t['models'])} models)")
        for c in t["conflicts"]:
            print(f"  conflict: {c}")
    return 0


def _cmd_validate(args) -> int:
    report = validate(args.dir, build=args.build, allow_other_target=args.allow_other_target)
    if args.json:
        print(json.dumps(report, indent=1))
    bad = 0
    for t in report:
        bad += len(t["problems"])
        if args.json:
            continue
        verdict = "ok" if not t["problems"] else f"{len(t['problems'])} problem(s)"
        print(f"{t['target_dir']}: {t['best_records_checked']} best records of "
              f"{t['workloads']} workloads replayed: {verdict}")
        for p in t["problems"]:
            print(f"  problem: {p}")
        for n in t["notes"]:
            print(f"  note: {n}")
    return 1 if bad else 0


def _cmd_prune(args) -> int:
    for t in prune(args.dir):
        print(f"{t['target_dir']}: {t['records_before']} records of "
              f"{t['workloads_before']} workloads -> {t['records_after']} of "
              f"{t['workloads_after']} ({t['unused_workloads_dropped']} unused workloads and "
              f"{t['bad_lines_dropped']} unreadable lines dropped)")
        if t["note"]:
            print(f"  note: {t['note']}")
    return 0
