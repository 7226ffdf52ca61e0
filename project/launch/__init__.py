"""Start every rank of a one-machine, several-process run at once, instead of one after the other.

Lightning's launcher starts ranks 1..N-1 only when rank 0 reaches ``trainer.fit``, and each of them then imports
torch and Lightning again: the start-ups run one after the other. ``python -m project`` instead reads the
layout cheaply (:mod:`project.launch.preparse`), imports once and forks the other ranks right after the imports
(:mod:`project.launch.early`); they run as if Lightning's launcher had started them, and rank 0 sees them
like the processes Lightning's launcher starts (:mod:`project.launch.ranks`). ``PROJECT_EARLY_LAUNCH=0`` turns
it off.
"""
