"""``python -m bench [--quick]``: raw PyTorch, Lightning's floor, plain Lightning and the template; table and plot."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.commands import REPO
from bench.harness import gpu_available, machine, run_all
from bench.report import from_json, markdown, plot, to_json
from bench.tasks import row_sets
from bench.workloads import rows

RESULTS = REPO / "bench" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run that checks the code paths (for tests)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3; quick: 1)")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads per process for every way (0: torch's default)"
    )
    parser.add_argument(
        "--ablate", action="store_true", help="also run the template without the callbacks that act on every step"
    )
    parser.add_argument(
        "--startup", action="store_true", help="only start-up: 1, 2, 4 processes to the first step, and the commands"
    )
    for extra in row_sets():  # the layers' own rows (bench/extras/<layer>/rows.py): --chargpt, --pipeline, ...
        extra.add_arguments(parser)
    parser.add_argument(
        "--processes",
        type=lambda text: {int(n) for n in text.split(",")},
        default=None,
        help="only the rows of these process counts, e.g. 2,4 (the DDP rows); results go to results/processes-2-4/",
    )
    parser.add_argument("--out", type=Path, default=None, help="where results.md and results.png go")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory: data, runs, results.json")
    parser.add_argument("--render", type=Path, default=None, help="only write the table and plot of a results.json")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "startup" if args.startup else "full"
    # Absolute: every run starts in its own directory. A start-up run never replaces the full run's results.
    default_out = {"quick": RESULTS / "tmp" / "quick", "startup": RESULTS / "startup", "full": RESULTS}[mode]
    if args.processes and mode == "full":  # a subset never replaces the full run's results
        default_out = RESULTS / ("processes-" + "-".join(map(str, sorted(args.processes))))
    # The last layer whose options were given picks the rows; its full run has its own results folder.
    picked = [(extra, folder) for extra in row_sets() if (folder := extra.chosen(args)) is not None][-1:]
    if picked and mode == "full":
        default_out = picked[0][1]
    out = (args.out or default_out).resolve()
    work = (args.work or RESULTS / "tmp" / mode).resolve()
    repeats = args.repeats or (1 if args.quick else 3)
    out.mkdir(parents=True, exist_ok=True)

    if args.render is not None:
        results, info, gpu_note = from_json(args.render.read_text())
    else:
        has_gpu, gpu_note = gpu_available()
        if not has_gpu:
            gpu_note = f"skipped: {gpu_note}"
        print(f"bench ({mode}): {repeats} repeat(s); GPU row: {gpu_note}", flush=True)
        found = rows(args.quick, has_gpu and not args.startup, args.ablate, args.startup)
        found = picked[0][0].rows(args, args.quick, has_gpu and not args.startup) if picked else found
        found = [row for row in found if not args.processes or row.processes in args.processes]
        results = run_all(found, repeats, work, args.threads, args.quick, log=lambda line: print(line, flush=True))
        info = machine()
        (work / "results.json").write_text(to_json(results, info, gpu_note) + "\n")
        print(f"every run: {work / 'results.json'}")
    text = markdown(results, info, gpu_note, args.quick)
    (out / "results.md").write_text(text)
    plot(results, out / "results.png")
    print()
    print(text)
    print(f"wrote {out / 'results.md'}, {out / 'results.png'}")
    bad = [r.row.key for r in results["rows"] if not r.equal_work()[0]]
    if bad:
        print(f"error: the ways did not do equal work (or failed) in {bad}; see the table", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
