"""Schedules stage: the schedule rules of every target family, CPU and GPU side by side.

- :mod:`.default`: the schedule of a kernel without a tuning record, the one ``compile``,
  tune's verification and the offline bundle all use (CPU: the kernel as it is, but for
  int8 kernels; GPU: dlight's rules with ours first);
- CPU: :mod:`.cpu_rules` (tvm-fusion's MetaSchedule rules: register tile, depthwise,
  plain), :mod:`.vnni` (int8 GEMMs and convs on ``vpdpbusd``), :mod:`.int8_dw` (int8
  depthwise convs with channels in vector lanes);
- GPU: :mod:`.dp4a` (packed int8 GEMMs on DP4A), :mod:`.mfma` (fp16 GEMMs on CDNA's
  matrix cores), :mod:`.tir_check` (the target's limits checked on a scheduled kernel's
  TIR, which the default GPU schedule and every GPU build enforce).

Nothing is imported here: each module is imported by the stage that uses it.
"""
