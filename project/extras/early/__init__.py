"""Start every rank of a one-machine CPU run at once, instead of one after the other (``python -m project`` only).

Lightning's launcher starts ranks 1..N-1 only when rank 0 reaches ``trainer.fit``, and each of them then imports
torch and Lightning again: the start-ups run one after the other. With this layer ``python -m project`` instead
reads the layout cheaply (:mod:`.preparse`), imports once and forks the other ranks right after the imports
(:mod:`.fork`); they run as if Lightning's launcher had started them, and rank 0 sees them like the processes
Lightning's launcher starts (:mod:`.ranks`, registered with :mod:`project.launch.ranks`). ``PROJECT_EARLY_LAUNCH=0``
turns it off; without the layer Lightning's launcher starts the ranks. See docs/extras/early.md.
"""
