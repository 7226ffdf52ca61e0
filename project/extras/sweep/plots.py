"""The study's standard plots as PNG images in its folder: optimisation history and parameter importances.

Drawn with ``optuna.visualization.matplotlib`` on the Agg backend (no display needed). Importances need at least
:data:`MIN_FOR_IMPORTANCE` completed trials; with fewer the plot is skipped and the note says why.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

#: Completed trials the importance evaluator needs.
MIN_FOR_IMPORTANCE = 2
HISTORY = "optimization_history.png"
IMPORTANCES = "param_importances.png"


def save_plots(study: Any, folder: Path) -> list[str]:
    """Draw the plots into ``folder``; one line per plot: where it went, or why it was skipped."""
    import matplotlib

    matplotlib.use("Agg")  # before pyplot: files only, whatever display the machine has
    from matplotlib import pyplot as plt
    from optuna.trial import TrialState
    from optuna.visualization import matplotlib as optuna_plots

    completed = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    notes = []
    drawings = [(HISTORY, optuna_plots.plot_optimization_history, 1)]
    drawings.append((IMPORTANCES, optuna_plots.plot_param_importances, MIN_FOR_IMPORTANCE))
    for name, draw, needed in drawings:
        if completed < needed:
            plural = "s" if needed > 1 else ""
            notes.append(f"{name} skipped: it needs {needed} completed trial{plural}, {completed} so far")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental, on every call
                axes = draw(study)
            axes.figure.savefig(folder / name, dpi=100, bbox_inches="tight")
            plt.close(axes.figure)
            notes.append(str(folder / name))
        except (ValueError, RuntimeError) as error:  # e.g. importances of parameters that never varied
            notes.append(f"{name} skipped: {' '.join(str(error).split())}")
    return notes
