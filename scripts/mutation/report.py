"""Summarise a finished mutmut 3 run (run from the work copy that holds ``mutants/``).

Prints the counts by status and, with ``--diffs``, every mutant that was not killed as its one-line change
(``file:function  -old  +new``), which docs/mutation-plan.md classifies.
"""

from __future__ import annotations

import sys
from collections import Counter

from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
from mutmut.utils.file_utils import walk_mutatable_files


def main() -> None:
    """Print the counts by status, and with ``--diffs`` each mutant that was not killed."""
    counts: Counter[str] = Counter()
    left: list[tuple[str, str, object]] = []
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, code in data.exit_code_by_key.items():
            status = status_by_exit_code[code]
            counts[status] += 1
            if status != "killed":
                left.append((name, status, path))
    total = sum(counts.values())
    print(f"mutants: {total}  " + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    if "--diffs" not in sys.argv:
        return
    for name, status, path in left:
        diff = get_diff_for_mutant(name, path=path)
        lines = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        change = "  ".join(" ".join(line.split()) for line in lines)
        print(f"{status:9} {name.removeprefix('project.plan.')}  {change}")


if __name__ == "__main__":
    main()
