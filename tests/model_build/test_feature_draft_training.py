"""Training a feature draft: resumable teacher shards, a Lightning run that resumes without a duplicated step,
and a draft that learns (its held-out loss falls below its starting point's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import lightning as L
import pytest
import torch
from safetensors.torch import load_file

from decode import Sampling, SpeculativeDecoder, policies, rules
from model_build.feature_draft.model import FeatureDraftShape, assemble_draft, initial_draft, trained_tensors
from model_build.feature_draft.shards import ShardMismatchError, ShardPlan, build_shards, shard_file
from model_build.feature_draft.training import FeatureTraining, TeacherData, held_out_losses, train_feature_draft
from tests.helpers.micro_models import micro_lm

VOCAB = 96
SHAPE = FeatureDraftShape(layers=1, vocab_subset=48)
TRAINING = FeatureTraining(steps=4, on_policy_steps=2, tokens_per_step=96, max_length=48, warmup_steps=2, unroll=2,
                           held_out_sequences=4, checkpoint_every=1)


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return micro_lm(VOCAB, seed=31, hidden=32, layers=2, init=0.3)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(4)
    return [torch.randint(1, VOCAB, (int(n),), generator=generator).tolist()
            for n in torch.randint(3, 12, (12,), generator=generator)]


def plan_for(target) -> ShardPlan:
    return ShardPlan(prompts_per_shard=4, response_tokens=10, generation_batch=3, teacher_batch=2, top_k=8,
                     target_sha256="micro", feature_layers=(target.config.num_hidden_layers,))


@pytest.fixture(scope="module")
def shards(target, prompts, tmp_path_factory) -> list[Path]:
    directory = tmp_path_factory.mktemp("teacher")
    return build_shards(target, prompts, directory, plan_for(target), eos=None, pad=0, vocab=VOCAB, shards=3)


def test_shards_resume_and_refuse_another_plan(target, prompts, shards):
    directory = shards[0].parent
    kept = shards[0].read_bytes()
    redo = shard_file(directory, "teacher", 1)
    before = load_file(redo)
    redo.unlink()
    again = build_shards(target, prompts, directory, plan_for(target), eos=None, pad=0, vocab=VOCAB, shards=3)
    assert again == shards and shards[0].read_bytes() == kept  # a finished shard is kept as it was
    redone = load_file(redo)  # the missing one is made again from its stored responses: the same content
    assert redone.keys() == before.keys()
    for name in ("tokens", "lengths", "prompt_lengths", "top_ids"):
        assert torch.equal(redone[name], before[name]), name
    for name in ("features", "top_probs"):  # float kernels may round differently from run to run
        torch.testing.assert_close(redone[name].float(), before[name].float(), atol=1e-2, rtol=1e-2)
    other = dataclasses.replace(plan_for(target), top_k=4)
    with pytest.raises(ShardMismatchError, match="another configuration"):
        build_shards(target, prompts, directory, other, eos=None, pad=0, vocab=VOCAB, shards=3)


def test_teacher_features_are_the_targets_hidden_states(target, shards):
    data = TeacherData(shards, max_length=64)
    ref = data.sequences[5]
    shard = data.shards[ref.shard]
    ids = shard["tokens"][ref.start:ref.start + ref.length].long()[None]
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    torch.testing.assert_close(shard["features"][ref.start:ref.start + ref.length].float(),
                               out.hidden_states[-1][0], atol=2e-2, rtol=2e-2)  # stored in bf16
    assert torch.equal(shard["top_ids"][ref.start:ref.start + ref.length, 0].long(), out.logits[0].argmax(-1))


def subset() -> torch.Tensor:
    return torch.arange(0, VOCAB, 2)


class Interrupted(Exception):
    """The stand-in for a killed run."""


class InterruptAt(L.Callback):
    """Stops the run after step ``step``, mid-epoch, as a kill would (its checkpoint written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise Interrupted


def test_a_resumed_run_takes_the_steps_an_uninterrupted_one_takes(target, shards, tmp_path):
    whole = initial_draft(target, SHAPE, subset())
    train_feature_draft(whole, shards, TRAINING, tmp_path / "whole", precision="32-true")
    halves = initial_draft(target, SHAPE, subset())
    with pytest.raises(Interrupted):
        train_feature_draft(halves, shards, TRAINING, tmp_path / "halves", precision="32-true",
                            callbacks=[InterruptAt(5)])  # in the on-policy pass
    resumed = initial_draft(target, SHAPE, subset())  # a fresh process: the weights come from last.ckpt
    result = train_feature_draft(resumed, shards, TRAINING, tmp_path / "halves", precision="32-true")
    assert result.steps == TRAINING.total_steps
    for name, tensor in trained_tensors(whole, torch.float32).items():
        torch.testing.assert_close(trained_tensors(resumed, torch.float32)[name], tensor)
    # negative control: restarting from scratch instead of resuming ends elsewhere
    scratch = initial_draft(target, SHAPE, subset())
    train_feature_draft(scratch, shards, dataclasses.replace(TRAINING, steps=3), tmp_path / "scratch",
                        precision="32-true")
    assert not torch.allclose(trained_tensors(scratch, torch.float32)["fc.weight"],
                              trained_tensors(whole, torch.float32)["fc.weight"])


@pytest.mark.parametrize("shape", [SHAPE, dataclasses.replace(SHAPE, first_layer="eagle3", feature_layers=(2,))],
                         ids=["fc", "eagle3"])
def test_training_lowers_the_held_out_loss_and_the_draft_decodes(target, shards, tmp_path, shape):
    training = dataclasses.replace(TRAINING, steps=40, on_policy_steps=0, lr=3e-3, checkpoint_every=40)
    draft = initial_draft(target, shape, subset())
    data = TeacherData(shards, training.max_length)
    held = data.sequences[-training.held_out_sequences:]
    before = held_out_losses(draft, data, held, training)
    result = train_feature_draft(draft, shards, training, tmp_path, precision="32-true")
    after = result.held_out
    assert after[0]["cross_entropy"] < before[0]["cross_entropy"] - 0.05
    assert after[1]["cross_entropy"] < before[1]["cross_entropy"] - 0.05
    shipped = trained_tensors(draft, torch.bfloat16)
    assert "model.embed_tokens.weight" not in shipped and shipped["lm_head.token_ids"].dtype == torch.long
    assembled = assemble_draft(target, draft.config, shipped)
    decoder = SpeculativeDecoder(target, assembled, rule=rules.Greedy(), policy=policies.Fixed(3),
                                 sampling=Sampling(temperature=0.0), eos_token_id=None)
    out = decoder.generate([5, 7, 11], max_new_tokens=16)
    reference = target.generate(torch.tensor([[5, 7, 11]]), max_new_tokens=16, do_sample=False, min_new_tokens=16)
    assert torch.equal(out.sequences, reference)


def test_the_command_names_an_unusable_target_in_one_line(tmp_path, capsys):
    from model_build.feature_draft.__main__ import main

    assert main(["--target", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 2 and error[-1].startswith("error: cannot load model") and not (tmp_path / "out").exists()
