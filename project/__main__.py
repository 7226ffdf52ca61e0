"""`python -m project fit|validate|test|predict|plan|check|consolidate|sweep`."""

import contextlib
import sys

from project.commands import Builds, answer_without_training_imports, command_of
from project.launch.orphans import die_with_launcher
from project.layers import hook, hooks  # already imported by the command table: standard library only

if __name__ == "__main__":
    die_with_launcher()  # a rank torchrun or Lightning's launcher started ends when its launcher dies; first
    answer_without_training_imports(sys.argv[1:])  # --help and unknown commands: no Lightning import
    command = command_of(sys.argv[1:])
    if command is not None and command.builds is Builds.DRIVER:  # a layer's (the sweep): starts its own processes
        hook(str(command.runner))(sys.argv[2:])
        raise SystemExit(0)
    from project.launch import stop_signals

    if command is not None and command.stops_on_signal:  # a stop signal during the imports ends with 75 too
        stop_signals.install_defaults()
    try:
        from project.cli import main

        # The layers' wraps of the command, after the imports (early: a CPU run's ranks 1..N-1 are forked here).
        with contextlib.ExitStack() as around:
            for wrap in hooks("around_command"):
                around.enter_context(wrap(sys.argv[1:]))
            main()
    except stop_signals.StopSignal as stop:  # before main() took over: the imports, the forks
        from project.errors import exit_with

        exit_with(stop_signals.stopped_early(stop), code=stop_signals.Preempted.exit_code)
