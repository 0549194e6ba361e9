"""Logs stage: the tuning-log directory and its tools.

- :mod:`.logdb`: the MetaSchedule database of one target directory (JSONL records, read
  and written crash-safe under a directory lock);
- :mod:`.dirs`: ``LOGS/<target>/`` itself, opened, checked and hashed;
- :mod:`.manifest`: ``manifest.json``, what each model's entry stores (plan, kernels,
  trials) and the target it was tuned for;
- :mod:`.tools`: ``tvm-fusion logs show|merge|validate|prune``.

Nothing is imported here: each module is imported by the stage that uses it.
"""
