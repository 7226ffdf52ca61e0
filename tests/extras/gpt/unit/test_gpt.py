"""The character-level GPT: text and windows, the network, generation, the export, the module's checks."""

from __future__ import annotations

import string
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from project.errors import UserError
from project.extras.gpt.chargpt import CharTextDataModule
from project.extras.gpt.chartext import (
    TextWindows,
    corpus_vocabulary,
    decode,
    encode,
    load_corpus,
    strided_starts,
    vocabulary,
)
from project.extras.gpt.generate import complete, generate
from project.extras.gpt.gpt import GPT, CausalSelfAttention
from project.extras.gpt.language_model import LanguageModel
from project.extras.gpt.token_rate import TokenRate
from project.plan.layout import Layout

VOCAB = vocabulary("\n .," + string.ascii_letters)


def _weights():
    """The export layer's writer and ``rebuild`` (a test that uses them skips without that layer)."""
    return pytest.importorskip("project.extras.export.weights")


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    args = {"vocab": VOCAB, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 16, **overrides}
    return GPT(**args)


# ------------------------------------------------------------------------------------------------ text and windows
def test_the_corpus_vocabulary_is_its_sorted_characters_and_round_trips():
    text = load_corpus()
    assert len(text) > 400_000
    vocab = corpus_vocabulary()
    assert vocab == "".join(sorted(set(text))) == vocabulary(text)
    assert 90 <= len(vocab) <= 120
    sample = text[1000:3000]
    ids = encode(sample, vocab)
    assert ids.dtype == torch.long and len(ids) == len(sample) and int(ids.max()) < len(vocab)
    assert decode(ids, vocab) == sample
    assert encode(vocab, vocab).tolist() == list(range(len(vocab)))


def test_encode_names_a_character_outside_the_vocabulary():
    with pytest.raises(ValueError, match="'é'"):
        encode("café", VOCAB)
    with pytest.raises(ValueError, match="sorted"):
        encode("ab", "ba")


def test_windows_are_shifted_by_one_and_batches_gather_the_same_samples():
    tokens = torch.arange(100)
    windows = TextWindows(tokens, block_size=8)
    assert len(windows) == 100 - 8
    x, y = windows[5]
    assert x.tolist() == list(range(5, 13)) and y.tolist() == list(range(6, 14))
    xs, ys = windows.__getitems__([91, 0, 7])
    for row, index in enumerate([91, 0, 7]):
        assert torch.equal(xs[row], windows[index][0]) and torch.equal(ys[row], windows[index][1])
    with pytest.raises(ValueError, match="no window"):
        TextWindows(torch.arange(8), block_size=8)


def test_strided_windows_cover_the_text_once():
    starts = strided_starts(100, 8)
    assert starts.tolist() == list(range(0, 92, 8))
    windows = TextWindows(torch.arange(100), 8, starts)
    targets = torch.cat([windows[i][1] for i in range(len(windows))]).tolist()
    assert targets == list(range(1, 1 + len(targets)))  # every position predicted once, in order
    assert strided_starts(100, 8, limit=3).tolist() == [0, 8, 16]


def test_the_datamodule_splits_by_position_and_validates_on_a_fixed_set():
    data = CharTextDataModule(block_size=32, val_windows=5, batch_size=4)
    data.setup("fit")
    tokens = encode(load_corpus(), data.vocab)
    cut = round(len(tokens) * 0.9)
    assert torch.equal(data.train_set.tokens, tokens[:cut]) and torch.equal(data.val_set.tokens, tokens[cut:])
    assert len(data.train_set) == cut - 32 and len(data.val_set) == 5
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert next(iter(data.predict_dataloader())) == ["\n"]
    with pytest.raises(ValueError, match="val_fraction"):
        CharTextDataModule(val_fraction=1.0)


# --------------------------------------------------------------------------------------------------- the network
def test_shapes_names_and_init_args():
    net = tiny()
    logits = net(torch.randint(len(VOCAB), (3, 16)))
    assert logits.shape == (3, 16, len(VOCAB))
    names = {name for name, _ in net.named_modules()}
    for part in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", "mlp.up", "mlp.down"):
        assert f"blocks.0.{part}" in names
    assert not any(name.endswith("bias") for name, _ in net.named_parameters())
    assert net.blocks[0].attn.n_head == 2
    assert _weights().network_spec(net)["init_args"]["vocab"] == VOCAB
    with pytest.raises(ValueError, match="block_size"):
        net(torch.zeros(1, 17, dtype=torch.long))


def test_a_later_token_never_changes_earlier_logits():
    net = tiny().eval()
    ids = torch.randint(len(VOCAB), (2, 16))
    changed = ids.clone()
    changed[:, 9] = (changed[:, 9] + 1) % len(VOCAB)
    with torch.no_grad():
        before, after = net(ids), net(changed)
    torch.testing.assert_close(after[:, :9], before[:, :9], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, 9:], before[:, 9:])


def test_column_sharded_attention_reads_its_heads_from_q_proj():
    """Two halves of q/k/v (by output rows) and of out_proj (by input columns) add up to the whole attention."""
    torch.manual_seed(0)
    full = CausalSelfAttention(n_embd=16, n_head=4).eval()
    x = torch.randn(2, 5, 16)
    halves = []
    for part in (slice(0, 8), slice(8, 16)):
        shard = CausalSelfAttention(n_embd=16, n_head=4).eval()
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(shard, name, nn.Linear(16, 8, bias=False))
            getattr(shard, name).weight.data = getattr(full, name).weight.data[part].clone()
        shard.out_proj = nn.Linear(8, 16, bias=False)
        shard.out_proj.weight.data = full.out_proj.weight.data[:, part].clone()
        halves.append(shard(x))
    with torch.no_grad():
        torch.testing.assert_close(halves[0] + halves[1], full(x), rtol=1e-5, atol=1e-6)


def test_tied_weights_share_one_tensor():
    net = tiny(tie_weights=True)
    assert net.lm_head.weight is net.tok_emb.weight


# ---------------------------------------------------------------------------------------------------- generation
def test_generation_is_reproducible_by_seed_and_restores_the_mode():
    net = tiny(dropout=0.1)
    net.train()
    first = complete(net, "The ", 20, temperature=1.0, seed=3)
    assert net.training
    assert len(first) == 20 and set(first) <= set(VOCAB)
    assert complete(net, "The ", 20, temperature=1.0, seed=3) == first
    assert complete(net, "The ", 20, temperature=1.0, seed=4) != first
    greedy = complete(net, "The ", 10, temperature=0.0, seed=1)
    assert complete(net, "The ", 10, temperature=0.0, seed=2) == greedy
    ids = generate(net, [1, 2], 16, temperature=0.8, seed=0, top_k=3)  # longer than block_size: context cropped
    assert ids.shape == (18,) and ids[:2].tolist() == [1, 2]
    with pytest.raises(ValueError, match="prompt"):
        generate(net, [], 3)


def test_the_export_rebuilds_without_the_corpus_and_writes_the_same_text(tmp_path):
    net = tiny()
    with torch.no_grad():
        net.lm_head.weight.mul_(50)  # a peaked distribution, so that a difference would show in the text
    _weights().check_rebuildable(_weights().network_spec(net), net)
    _weights().export_network(net, tmp_path)
    rebuilt = _weights().rebuild(tmp_path)
    assert isinstance(rebuilt, GPT) and rebuilt.vocab == VOCAB and not rebuilt.training
    ids = torch.randint(len(VOCAB), (2, 16))
    with torch.no_grad():
        assert torch.equal(rebuilt(ids), net.eval()(ids))
    assert complete(rebuilt, "A ", 30, 0.8, seed=7) == complete(net, "A ", 30, 0.8, seed=7)


# ------------------------------------------------------------------------------------------- the LightningModule
def module_on(data: SimpleNamespace, **net_args) -> LanguageModel:
    module = LanguageModel(tiny(**net_args))
    module._trainer = SimpleNamespace(datamodule=data)  # what setup reads of the Trainer
    return module


def test_the_module_refuses_data_the_network_cannot_read():
    module_on(SimpleNamespace(vocab=VOCAB, block_size=16)).setup("fit")
    with pytest.raises(UserError, match="vocabulary"):
        module_on(SimpleNamespace(vocab=VOCAB[:-1], block_size=16)).setup("fit")
    with pytest.raises(UserError, match="block_size=32"):
        module_on(SimpleNamespace(vocab=VOCAB, block_size=32)).setup("fit")


def test_the_module_predicts_a_row_per_prompt():
    module = LanguageModel(tiny(), generate_chars=12, temperature=0.0)
    rows = module.predict_step(["The ", "A"], 0)
    assert rows["prompt"] == ["The ", "A"] and [len(t) for t in rows["completion"]] == [12, 12]
    assert rows["completion"][0] == complete(module.net, "The ", 12, temperature=0.0)


class FakeMesh:
    """What on_train_start reads of a model-parallel strategy's device mesh."""

    mesh_dim_names = ("data_parallel", "tensor_parallel")

    def __getitem__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(size=lambda: {"data_parallel": 2, "tensor_parallel": 2}[name])


def test_tokens_are_counted_once_per_tensor_parallel_group_and_pipeline():
    module = module_on(SimpleNamespace(), n_head=2)
    trainer = module._trainer
    trainer.world_size, trainer.num_nodes, trainer.accelerator = 4, 1, object()
    trainer.strategy = SimpleNamespace()  # a user's DDP strategy: no mesh, every process trains its own samples
    module.on_train_start()
    assert module._data_parallel == 4
    trainer.strategy = SimpleNamespace(device_mesh=FakeMesh())  # Lightning's ModelParallelStrategy, (dp, tp) = (2, 2)
    module.on_train_start()
    assert module._data_parallel == 2
    # a strategy the template built carries the plan's layout: a pipeline's stages share their batch
    for layout, data_parallel in (
        (Layout("cpu", "cpu", 4, 1, dp_replicate=2, tp=2), 2),
        (Layout("cpu", "cpu", 4, 1, dp_replicate=2, pp=2), 2),
        (Layout("cpu", "cpu", 4, 1, dp_replicate=1, pp=4), 1),
    ):
        trainer.strategy = SimpleNamespace(project_layout=layout)
        module.on_train_start()
        assert module._data_parallel == data_parallel, layout


def test_token_rate_counts_training_time_only(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("project.extras.gpt.token_rate.time.perf_counter", lambda: now[0])
    rate = TokenRate()
    assert rate.report() is None
    rate.step(1000)
    now[0] += 1.0
    rate.step(1000)
    now[0] += 1.0
    rate.pause()
    now[0] += 5.0  # validation
    rate.resume()
    assert rate.report() == pytest.approx(1000.0)
    rate.step(500)
    now[0] += 0.5
    assert rate.report() == pytest.approx(1000.0)
