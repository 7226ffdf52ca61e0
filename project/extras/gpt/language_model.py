"""The LightningModule of a next-token language model: loss, tokens per second and generated text."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric

from project.errors import UserError
from project.export import load_weights
from project.extras.gpt.generate import complete
from project.extras.gpt.token_rate import TokenRate
from project.models.hparams import save_config_hyperparameters
from project.models.step_logging import is_logged_step, log_on_logged_steps
from project.parallel.strategies import layout_of

Batch = tuple[Tensor, Tensor]


class LanguageModel(L.LightningModule):
    """Train a plain next-token network (e.g. :class:`project.extras.gpt.gpt.GPT`) on ``(x, y)`` id windows.

    Logs ``train/loss`` and ``train/tokens_per_s`` (all data-parallel processes' tokens, training time only) on the
    steps the Trainer writes, and ``val/loss`` (mean cross-entropy per character, in nats) over the whole
    validation set. ``predict`` continues each prompt of the datamodule: ``predictions.csv`` gets the columns
    ``prompt`` and ``completion``. The optimizer comes from the config's ``optimizer:`` section.

    Args:
        net: The network: ids ``[B, T]`` to logits ``[B, T, vocab]``, with ``vocab`` (its characters) and
            ``block_size``.
        weights: Optional path to start from (a plain, DP/DDP or Lightning state dict), loaded weights-only.
        generate_chars: Characters ``predict`` writes after each prompt.
        temperature: Sampling temperature of ``predict`` (0: greedy).
        top_k: Sample among the ``top_k`` most likely characters only (``None``: all).
        generation_seed: Seed of each prompt's sampling: the same prompt and weights give the same text, on any
            number of processes and in a plain process that rebuilt the export.
    """

    def __init__(
        self,
        net: nn.Module,
        weights: str | None = None,
        generate_chars: int = 200,
        temperature: float = 0.8,
        top_k: int | None = None,
        generation_seed: int = 0,
    ) -> None:
        super().__init__()
        save_config_hyperparameters(self, "net")
        self.net = net
        #: Where the starting weights came from (``None``: the network's initialisation).
        self.weights_from = weights
        if weights is not None:
            load_weights(self.net, weights)
        self.generate_chars = generate_chars
        self.temperature = temperature
        self.top_k = top_k
        self.generation_seed = generation_seed
        self.val_loss = MeanMetric()
        self._train_loss: Tensor | None = None  # the last training step's loss, for on_train_batch_end
        self._rate = TokenRate()
        self._data_parallel = 1  # processes that train different samples, set when training starts

    def forward(self, idx: Tensor) -> Tensor:
        """Next-token logits ``[B, T, vocab]``."""
        return self.net(idx)

    def setup(self, stage: str) -> None:
        """Refuse data that the network cannot read: another vocabulary, or windows longer than its context."""
        # Lightning sets the datamodule up before the module, so its vocabulary is known here.
        data = self.trainer.datamodule
        vocab, block = getattr(data, "vocab", None), getattr(data, "block_size", None)
        net_vocab, net_block = getattr(self.net, "vocab", None), getattr(self.net, "block_size", None)
        if vocab is not None and net_vocab is not None and vocab != net_vocab:
            raise UserError(
                f"the data's vocabulary ({len(vocab)} characters) is not the network's ({len(net_vocab)}): "
                "build the network with vocab: null (the corpus's) or with the data's characters"
            )
        if block is not None and net_block is not None and block > net_block:
            raise UserError(
                f"data.init_args.block_size={block} is longer than the network's block_size={net_block}; "
                "give both the same block_size"
            )

    def pipeline_loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """Mean cross-entropy per token.

        Every step's loss, and what a pipeline's last stage computes per micro-batch (docs/parallel.md,
        "Pipeline parallelism").
        """
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    def _loss(self, batch: Batch) -> Tensor:
        x, y = batch
        return self.pipeline_loss(self.net(x), y)

    def on_train_start(self) -> None:
        """Count the processes that train different samples: a tensor-parallel group or a pipeline shares its batch."""
        self._data_parallel = layout_of(self.trainer).dp_size

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        """Count the step's tokens, every data-parallel process's (the shape is on the host: no sync)."""
        self._rate.step(batch[0].numel() * self._data_parallel)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        """Mean cross-entropy per token on one (per-device) batch."""
        loss = self._loss(batch)
        self._train_loss = loss.detach()
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log ``train/loss`` and ``train/tokens_per_s`` on the steps whose metrics the Trainer writes."""
        loss = self._train_loss
        if loss is None and isinstance(outputs, dict):  # a pipeline's schedule ran the step, not training_step
            loss = outputs.get("loss")
        log_on_logged_steps(self, "train/loss", loss, prog_bar=True)
        if is_logged_step(self.trainer):  # a report starts a new window: only on the steps that are written
            rate = self._rate.report()
            if rate is not None:
                self.log("train/tokens_per_s", rate, on_step=True, on_epoch=False)

    def on_validation_start(self) -> None:
        """Stop the tokens-per-second clock: validation is not training time."""
        self._rate.pause()

    def on_validation_end(self) -> None:
        """Restart the clock."""
        self._rate.resume()

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        """Accumulate ``val/loss`` over every validation token (weighted, so uneven shards give the exact mean)."""
        self.val_loss.update(self._loss(batch), weight=batch[1].numel())
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)

    def predict_step(self, batch: list[str], batch_idx: int) -> dict[str, list[str]]:
        """Continue each prompt with ``generate_chars`` characters: one row ``prompt, completion`` each."""
        prompts = [batch] if isinstance(batch, str) else list(batch)
        texts = [
            complete(self.net, p, self.generate_chars, self.temperature, self.generation_seed, self.top_k)
            for p in prompts
        ]
        return {"prompt": prompts, "completion": texts}
