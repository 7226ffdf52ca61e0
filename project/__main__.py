"""`python -m project fit|validate|test|predict|plan|check|consolidate`."""

import sys

from project.commands import answer_without_training_imports

if __name__ == "__main__":
    answer_without_training_imports(sys.argv[1:])  # --help and unknown commands: no Lightning import
    from project.cli import main

    main()
