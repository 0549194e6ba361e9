"""TVM compatibility: the work-arounds for TVM 0.27 that every stage above may need.

- :mod:`.fast_import`: TVM's tensor intrinsics imported in about a second (TVMScript's
  parser given a light ``inspect.stack`` for that import only), our VNNI intrinsic, and
  the kernel builder MetaSchedule's workers run;
- :mod:`.fast_math`: float32 ``exp`` on CPUs lowered as a polynomial the vectorizer
  takes, inside :func:`~.fast_math.vectorizable_exp` only;
- :mod:`.ms_compat`: MetaSchedule's pandas task table in Jupyter, its logger crashing on
  an unnamed handler, and the pooling rules TVM 0.27 does not register.

Importing any of them changes nothing in TVM; each change is made by a call and undone
after it.
"""
