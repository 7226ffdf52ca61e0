"""``python -m project check``: a self-test of the real layout before a long job.

It runs the configured job for a few steps under whatever launched it (Lightning's launcher, torchrun,
SLURM, Kubeflow) and checks, in this order: every rank joined and says where it runs; an all-gather and
an all-reduce of known values give the known answers (the rank whose value is wrong is named, with its
host and device); a barrier; all-reduce latency and bandwidth at a few sizes; that a tiny model trained
by DDP on this layout ends at the weights one process reaches on the same global batches; that the
training loader's ranks together draw exactly the global batches one process would; and each rank's own
step time on the configured model and data. :mod:`project.extras.check.report` prints the table and writes
``check.json``; any failure exits non-zero naming the rank, host and device.
"""
