"""The export of a network built in ``__init__`` and sharded over two fsdp processes (from
tests/cli/test_export_program.py): its state dict, gathered, and one warning line instead of a program.
"""

from __future__ import annotations

from user_nets import SequentialClassifier

from project.export import load_weights

from helpers import CONFIGS, DIGITS, FAST, run_cli, run_dirs

SHORT = ["--config", DIGITS, "--config", FAST, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4"]
CPU_FSDP = str(CONFIGS / "sharding" / "cpu_fsdp.yaml")


def test_a_sharded_network_built_in_init_exports_its_state_dict_with_one_warning(tmp_path):
    result = run_cli(["fit", *SHORT, "--config", CPU_FSDP, "--model", "user_nets.SequentialClassifier"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert [w for w in warnings if "model.pt2" in w] == [
        "warning: no export/model.pt2: torch.nn.modules.container.Sequential is sharded over the processes: it "
        "is not exported as a program; export/ holds the state dict model.pt only (build the network in your code "
        "and load it with project.export.load_weights)"
    ]
    (run,) = run_dirs(tmp_path)
    load_weights(SequentialClassifier().net, run / "export" / "model.pt")
