"""``predict`` writes ``predictions.csv`` by default, one row per sample in dataset order, for any output shape.

The shapes themselves are checked on :func:`prediction_table` and on an in-process Trainer (one process,
no CLI); the CLI runs check what a user sees: the default writer at 1 and 2 processes for a dict of a
tensor and strings, a listed writer that is not doubled, and one ``error:`` line for an output that cannot
be split per sample.
"""

from __future__ import annotations

import csv
import json
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from project.commands import COMMANDS
from project.extras.predictions.hook import prediction_callbacks
from project.extras.predictions.rows import Unsplittable, describe, prediction_csv, prediction_table
from project.extras.predictions.writer import PredictionsWriter, lists_prediction_writer

from helpers import CPU_DDP, DIGITS, FAST, assert_clean_error, run_cli, run_dirs, two_at_a_time

B = 3
SHAPES = {
    "a class per sample": (torch.tensor([4, 0, 9]), ["prediction"], [[4], [0], [9]]),
    "a vector per sample": (torch.tensor([[0.5, 1.0]] * 3), ["prediction"], [["[0.5, 1.0]"]] * 3),
    "a [B, 1] column": (torch.tensor([[1.5], [2.5], [3.5]]), ["prediction"], [[1.5], [2.5], [3.5]]),
    "a tuple of tensors": (
        (torch.tensor([1, 2, 3]), torch.zeros(3, 2)),
        ["prediction_0", "prediction_1"],
        [[i, "[0.0, 0.0]"] for i in (1, 2, 3)],
    ),
    "a list of tensors": (
        [torch.arange(3), torch.arange(3) * 2],
        ["prediction_0", "prediction_1"],
        [[0, 0], [1, 2], [2, 4]],
    ),
    "a dict of tensors": (
        {"cls": torch.arange(3), "score": torch.tensor([0.5, 0.25, 1.0])},
        ["cls", "score"],
        [[0, 0.5], [1, 0.25], [2, 1.0]],
    ),
    "strings": (["cat", "dog", "a, b"], ["prediction"], [["cat"], ["dog"], ["a, b"]]),
    "a dict of a tensor and strings": (
        {"probs": torch.eye(3)[:, :2], "label": ["x", "y", "z"]},
        ["probs", "label"],
        [["[1.0, 0.0]", "x"], ["[0.0, 1.0]", "y"], ["[0.0, 0.0]", "z"]],
    ),
    "nested and NumPy": (
        {"a": (np.arange(3), [1.0, 2.0, 3.0]), "b": {"c": [torch.tensor(7)] * 3}},
        ["a_0", "a_1", "b.c"],
        [[0, 1.0, 7], [1, 2.0, 7], [2, 3.0, 7]],
    ),
}
UNSPLITTABLE = {
    "a scalar per batch": (torch.tensor(0.5), "it is one value for the whole batch"),
    "a float per batch": (0.5, "it is one value for the whole batch"),
    "a dict with a scalar": ({"loss": torch.tensor(1.0), "cls": torch.arange(3)}, "column 'loss' is one value"),
    "a tensor longer than the batch": (torch.arange(4), "column 'prediction' has 4 values for a batch of 3"),
    "strings fewer than the batch": (["a", "b"], "column 'prediction' has 2 values for a batch of 3"),
    "a tuple of strings": (("a", "b", "c"), "column 'prediction_0' is one value"),
    "an empty dict": ({}, "it is a dict {}, nothing per sample"),
    "a column named index": ({"index": torch.arange(3)}, "['index'] would appear twice"),
}


@pytest.mark.parametrize("output, names, rows", SHAPES.values(), ids=SHAPES)
def test_each_output_shape_becomes_one_row_per_sample(output, names, rows):
    assert prediction_table(output, B) == (names, rows)
    # Unknown batch size (a batch of strings): the columns' common length is the batch.
    assert prediction_table(output, None) == (names, rows)


@pytest.mark.parametrize("output, said", UNSPLITTABLE.values(), ids=UNSPLITTABLE)
def test_an_output_that_cannot_be_split_per_sample_is_named(output, said):
    with pytest.raises(Unsplittable) as raised:
        prediction_table(output, B)
    assert said in str(raised.value)


def test_csv_keeps_todays_format_and_quotes_what_needs_it():
    names, rows = prediction_table({"probs": torch.tensor([[0.5, 0.25]]), "label": ["a, b"]}, 1)
    assert prediction_csv(names, {0: [(0, rows[0])]}) == 'index,probs,label\n0,"[0.5, 0.25]","a, b"\n'
    # Rows go by their sample's index; a loader that has none (a stream) numbers them as they came.
    loaders = {0: [(1, [4]), (0, [3])], 1: [(None, [5]), (None, [6])]}
    assert prediction_csv(["prediction"], loaders, several=True) == (
        "dataloader,index,prediction\n0,0,3\n0,1,4\n1,0,5\n1,1,6\n"
    )


class _Mine(BasePredictionWriter):
    def write_on_batch_end(self, *args: object) -> None:
        pass


def test_the_default_writer_only_where_the_config_lists_none():
    assert lists_prediction_writer([PredictionsWriter()]) and lists_prediction_writer(_Mine())
    assert not lists_prediction_writer(None) and not lists_prediction_writer([L.Callback()])
    mine = Namespace(class_path=f"{__name__}._Mine", init_args=Namespace())
    for name, listed, expected in (("predict", None, 1), ("predict", [mine], 0), ("test", None, 0)):
        config = Namespace(trainer=Namespace(callbacks=listed))
        own = prediction_callbacks(None, COMMANDS[name], config)
        assert sum(isinstance(c, PredictionsWriter) for c in own) == expected, (name, listed)


class _Returns(L.LightningModule):
    """``predict_step`` returns ``make(x, batch_idx)`` of the batch's inputs."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make
        self.layer = nn.Linear(1, 1)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self.make(batch[0], batch_idx)


def _predict(tmp_path: Path, make, *loaders: DataLoader) -> Path:
    """Predict in-process with the default writer; the path its CSV would have."""
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        default_root_dir=tmp_path,
        callbacks=[PredictionsWriter()],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.predict(_Returns(make), dataloaders=list(loaders) if len(loaders) > 1 else loaders[0])
    return tmp_path / "predictions.csv"


def _loader(n: int, batch_size: int = 4, shuffle: bool = False) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n, dtype=torch.float32)), batch_size=batch_size, shuffle=shuffle)


class _Stream(IterableDataset):
    def __iter__(self):
        return iter([(torch.tensor(float(i)),) for i in range(10)])


def test_in_a_trainer_rows_come_in_dataset_order_from_any_loader_and_several_loaders_are_told_apart(tmp_path):
    # 10 samples in batches of 4, 4, 2: a tuple of a tensor and one string per sample.
    path = _predict(tmp_path / "one", lambda x, _: (x * 2, [f"s{int(v)}" for v in x]), _loader(10))
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["index", "prediction_0", "prediction_1"]
    assert rows[1:] == [[str(i), str(2.0 * i), f"s{i}"] for i in range(10)]
    # A shuffled loader (parallel: null leaves it so): the rows still come out in dataset order.
    path = _predict(tmp_path / "shuffled", lambda x, _: x.long(), _loader(10, shuffle=True))
    assert path.read_text().splitlines()[1:] == [f"{i},{i}" for i in range(10)]
    # A stream has no indices (the last batch is short, 2 of 4): numbered as it came.
    path = _predict(tmp_path / "stream", lambda x, _: x.long(), DataLoader(_Stream(), batch_size=4))
    assert path.read_text().splitlines()[1:] == [f"{i},{i}" for i in range(10)]
    path = _predict(tmp_path / "two", lambda x, _: x, _loader(5), _loader(3))
    assert path.read_text().splitlines() == [
        "dataloader,index,prediction",
        *(f"0,{i},{float(i)}" for i in range(5)),
        *(f"1,{i},{float(i)}" for i in range(3)),
    ]


def test_in_a_trainer_a_bad_batch_stops_predict_and_none_writes_nothing_and_says_so(tmp_path, capsys):
    # The last batch (2 samples) returns the full batch size's worth: refused before anything is written.
    with pytest.raises(Unsplittable, match=r"batch 2, .* column 'prediction' has 4 values for a batch of 2"):
        _predict(tmp_path / "bad", lambda x, _: torch.zeros(4), _loader(10))
    assert not (tmp_path / "bad" / "predictions.csv").exists()
    with pytest.raises(Unsplittable, match="None for some batches and values for others"):
        _predict(tmp_path / "mixed", lambda x, i: None if i else x, _loader(10))
    assert not _predict(tmp_path / "none", lambda x, _: None, _loader(10)).exists()
    assert "warning: predict_step returned None for every batch: no predictions.csv written" in capsys.readouterr().err


# --------------------------------------------------------------------------- the CLI, as a user runs it
# 45 test samples in batches of 16: 23 + 22 over 2 processes (uneven shards, partial last batches).
PLAIN = ["--data.class_path", "user_code.PlainDigits", "--data.init_args.bs", "16"]
SHAPED = ["--model.class_path", "user_code.ShapedPredictions", *PLAIN, "--ckpt_path", "none"]
LISTED = [
    "--trainer.callbacks+=project.extras.predictions.writer.PredictionsWriter",
    "--trainer.callbacks.init_args.filename",
    "listed.csv",
]


def predict(cwd: Path, *args: str):
    """``predict`` of the digits config with ``args`` in ``cwd``: the result and the run directories."""
    cwd.mkdir()
    result = run_cli(["predict", "--config", DIGITS, "--config", FAST, *SHAPED, *args], cwd)
    return result, run_dirs(cwd)


def read(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(path.open()))
    return rows[0], rows[1:]


@pytest.mark.distributed
def test_predict_writes_a_dict_of_a_tensor_and_strings_by_default_at_one_and_two_processes(tmp_path):
    (one, one_dirs), (two, two_dirs) = two_at_a_time(
        partial(predict, tmp_path / "one", *LISTED), partial(predict, tmp_path / "two", "--config", CPU_DDP)
    )
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-3000:] + two.stderr[-3000:]
    # A config that lists a writer gets that one only; without one, the default writes predictions.csv.
    assert sorted(p.name for p in one_dirs[-1].glob("*.csv")) == ["listed.csv"]
    header, rows = read(two_dirs[-1] / "predictions.csv")
    header_1, rows_1 = read(one_dirs[-1] / "listed.csv")
    assert header == header_1 == ["index", "probs", "label"]
    assert [int(r[0]) for r in rows] == [int(r[0]) for r in rows_1] == list(range(45))
    assert [r[2] for r in rows] == [r[2] for r in rows_1] and rows[0][2].startswith("digit ")
    probs, probs_1 = (np.array([json.loads(r[1]) for r in rs]) for rs in (rows, rows_1))
    assert probs.shape == (45, 10)
    np.testing.assert_allclose(probs, probs_1, rtol=1e-5, atol=1e-7)


@pytest.mark.distributed
def test_a_scalar_per_batch_is_one_error_line_and_nothing_written(tmp_path):
    results = two_at_a_time(
        *(
            partial(predict, tmp_path / name, "--model.init_args.returns", "scalar", *layout)
            for name, layout in (("one", ()), ("two", ("--config", CPU_DDP)))
        )
    )
    for result, dirs in results:
        assert_clean_error(result, "predict_step returned a tensor of shape []", "one value for the whole batch")
        assert result.returncode == 2
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # rank 0's
        assert "needs one value per sample" in line
        assert not any(d.glob("*.csv") for d in dirs), dirs


def test_a_list_of_one_tensor_per_sample_of_varying_length_is_one_column():
    tokens = [torch.arange(i % 4 + 1) for i in range(B)]
    assert prediction_table({"tokens": tokens, "score": torch.zeros(B)}, B) == (
        ["tokens", "score"],
        [[json.dumps(list(range(i % 4 + 1))), 0.0] for i in range(B)],
    )


def test_a_refusal_of_many_columns_counts_them_in_a_short_line():
    output = {"tokens": [torch.arange(i % 7 + 1) for i in range(41)], "score": torch.zeros(40)}
    with pytest.raises(Unsplittable) as raised:
        prediction_table(output, 40)
    assert "41 columns ('tokens_0', 'tokens_1', ...)" in str(raised.value) and len(str(raised.value)) < 120
    assert len(describe(output)) < 80
