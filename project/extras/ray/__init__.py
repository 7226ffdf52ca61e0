"""``parallel.launcher: ray``: the same command as a Ray Train job of one worker per rank (:mod:`.job`).

The core plans the job (a Ray driver's plan, a Ray worker's ranks: :mod:`project.plan.launchers`) and asks the
layers who submits it (:mod:`project.launch.submit`); this layer does, and waits. See docs/extras/ray.md.
"""
