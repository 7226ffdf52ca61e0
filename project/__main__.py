"""`python -m project fit|validate|test|predict|plan|check|consolidate`."""

import sys

from project.commands import answer_without_training_imports

if __name__ == "__main__":
    answer_without_training_imports(sys.argv[1:])  # --help and unknown commands: no Lightning import
    from project.cli import main
    from project.launch.early import ranks_started_at_once

    # N CPU processes on this machine: ranks 1..N-1 are forked here, after the imports, and start with rank 0.
    with ranks_started_at_once(sys.argv[1:]):
        main()
