"""The gpt layer's bench rows plug into ``python -m bench`` through ``bench/tasks.py``; the bench names none."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO))  # `bench` is a folder of the repository, not an installed package
from bench.commands import command
from bench.extras.gpt import rows as gpt_rows
from bench.extras.gpt import task
from bench.tasks import row_sets, tasks


def _options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ablate", action="store_true")
    gpt_rows.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_bench_finds_the_layers_task_and_rows_on_disk():
    assert tasks()["chargpt"] is task and gpt_rows in row_sets()
    workload = gpt_rows.QUICK_CHARGPT
    assert workload.base_config == "configs/gpt/chargpt.yaml" and (REPO / workload.base_config).is_file()
    config = workload.template_config()
    assert config["model"]["class_path"] == "project.extras.gpt.language_model.LanguageModel"
    assert config["data"]["class_path"] == task.DATA_CLASS


def test_its_options_pick_its_rows_and_results_folder():
    assert gpt_rows.chosen(_options()) is None
    chargpt = _options("--chargpt")
    assert gpt_rows.chosen(chargpt) == gpt_rows.RESULTS / "chargpt"
    assert [row.key for row in gpt_rows.rows(chargpt, quick=True, gpu=False)] == ["chargpt-cpu-1", "chargpt-cpu-2"]
    ablated = gpt_rows.rows(_options("--chargpt", "--ablate"), quick=True, gpu=False)
    assert all(row.variants[-2:] == ("lean", "hooks") for row in ablated)
    pipeline = _options("--pipeline", "1f1b")
    assert gpt_rows.chosen(pipeline) == gpt_rows.RESULTS / "pipeline"
    (row,) = gpt_rows.rows(pipeline, quick=True, gpu=False)
    assert row.key == "chargpt-cpu-2-pp2-1f1b"
    raw = command("raw", row, Path("data.pt"), Path("config.yaml"))
    assert str(REPO / task.RAW_PIPELINE) in raw and (REPO / task.RAW_PIPELINE).is_file()
    with pytest.raises(SystemExit):
        _options("--pipeline", "zigzag")


def test_no_core_bench_module_names_the_layer():
    core = sorted((REPO / "bench").glob("*.py"))
    found = []
    for path in core:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {name}" for name in names if name.startswith(("bench.extras", "project.extras"))]
    assert found == []
