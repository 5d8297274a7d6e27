"""A job with a fixed run directory is preempted (SIGTERM) in the middle of an epoch, then started again
with the very same command (``ckpt_path=auto``), as a scheduler requeues it: the first run leaves a
step-exact last.ckpt and exits 143, the second continues at the next step and ends with exactly the
weights of an uninterrupted run. The uninterrupted run, with stdout sent to a file (``> log.txt``), shows
the progress lines a run without a terminal writes to stdout and train.log. Ctrl-C (SIGINT) does the same
(exit 130), where it used to stop without saving, losing the epoch; a second Ctrl-C stops at once."""

from __future__ import annotations

import functools
import os
import signal
import subprocess

import pytest
import torch
from reliability_fixtures import TINY, run_train, start_train
from torch.utils.data import TensorDataset
from train_overrides import compose_config

from segattn.data.resumable import ResumableDataLoader
from segattn.training.preemption import PreemptionCheckpoint, requeue_slurm_job

# 4 steps per epoch, 2 epochs; deterministic, one loader worker (seeded per epoch from the torch RNG),
# warmup then poly decay so the LR differs at every step.
RUN = [
    *TINY,
    "data.num_train=8",
    "data.batch_size=2",
    "data.num_workers=1",
    "trainer.max_epochs=2",
    "trainer.deterministic=true",
    "scheduler.warmup_steps=3",
    "optimizer.lr=1e-3",
    "logger=none",
    "test_after_fit=false",
    "ckpt_path=auto",
    "trainer.log_every_n_steps=2",
]
SIGNAL_AT_STEP_5 = ["+callbacks.signal_at._target_=fault_callbacks.SignalAt", "+callbacks.signal_at.step=5"]
SIGTERM_AT_STEP_5 = [*SIGNAL_AT_STEP_5, "+callbacks.signal_at.name=SIGTERM"]
SIGINT_AT_STEP_5 = [*SIGNAL_AT_STEP_5, "+callbacks.signal_at.name=SIGINT"]  # Ctrl-C


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def finish(job, timeout: int = 180) -> subprocess.CompletedProcess:
    stdout, stderr = job.communicate(timeout=timeout)
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)


@pytest.mark.slow
def test_sigterm_mid_epoch_then_the_same_command_resumes_at_the_next_step(tmp_path):
    logs, reference = tmp_path / "logs", tmp_path / "reference"
    logs.mkdir()
    reference.mkdir()
    log_txt = tmp_path / "log.txt"
    # The runs that do not wait for one another run at the same time (each is mostly one busy core): the
    # uninterrupted reference, the SIGTERM job and the Ctrl-C job; then both resumes.
    # stdout to a file, not a terminal: no progress bar, plain progress lines
    straight_err = tmp_path / "straight.stderr"
    straight = start_train(reference, *RUN, run="straight", stdout=log_txt, stderr=straight_err)
    ctrl_c = start_train(logs, *RUN, *SIGINT_AT_STEP_5, run="ctrl_c")
    job = [*RUN, *SIGTERM_AT_STEP_5]  # a requeue re-runs this exact command
    preempted = run_train(logs, *job, run="job42")
    assert preempted.returncode == 128 + signal.SIGTERM, preempted.stdout[-3000:] + preempted.stderr[-3000:]
    last = logs / "job42" / "checkpoints" / "last.ckpt"
    assert "preempted by SIGTERM at epoch 1" in preempted.stdout + preempted.stderr
    stopped = load(last)
    assert (stopped["epoch"], stopped["global_step"]) == (1, 6)  # mid-epoch: step 2 of epoch 1's 4
    assert not list(last.parent.glob(".*.tmp")) and not list(last.parent.glob("last-v*.ckpt"))

    # Ctrl-C: the same step-exact save and resume, exit status 128 + SIGINT
    interrupted = finish(ctrl_c)
    assert interrupted.returncode == 128 + signal.SIGINT, interrupted.stderr[-3000:]
    text = interrupted.stdout + interrupted.stderr
    assert "received SIGINT: stopping after this training step (Ctrl-C again to stop at once" in text
    assert "interrupted by SIGINT (Ctrl-C) at epoch 1: saved " in text
    ctrl_c_last = logs / "ctrl_c" / "checkpoints" / "last.ckpt"
    assert (load(ctrl_c_last)["epoch"], load(ctrl_c_last)["global_step"]) == (1, 6)
    ctrl_c_resumed = start_train(logs, *RUN, *SIGINT_AT_STEP_5, run="ctrl_c")

    resumed = run_train(logs, *job, run="job42")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming from {last}" in resumed.stdout + resumed.stderr
    assert straight.wait(timeout=180) == 0, log_txt.read_text()[-3000:] + straight_err.read_text()[-3000:]
    for text in (log_txt.read_text(), (reference / "straight" / "train.log").read_text()):
        assert "[segattn.train][INFO] - epoch 1/2 step 2/8 loss " in text
        assert "[segattn.train][INFO] - epoch 2/2 step 8/8 loss " in text and " img/s ETA " in text
        assert "[segattn.train][INFO] - epoch 2/2 step 8 val mIoU " in text

    final, expected = load(last), load(reference / "straight" / "checkpoints" / "last.ckpt")
    assert (final["epoch"], final["global_step"]) == (expected["epoch"], expected["global_step"]) == (1, 8)
    for name, value in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], value), name
    for key, state in expected["optimizer_states"][0]["state"].items():
        assert torch.equal(final["optimizer_states"][0]["state"][key]["exp_avg"], state["exp_avg"])
    assert not torch.equal(  # the preempted run's weights really were two steps behind
        stopped["state_dict"]["model.head.classifier.weight"],
        expected["state_dict"]["model.head.classifier.weight"],
    )

    # The Ctrl-C job's resume, started above, ends with the uninterrupted run's weights too
    resumed = finish(ctrl_c_resumed)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    final = load(ctrl_c_last)
    assert final["global_step"] == 8
    for name, value in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], value), name


def test_a_second_ctrl_c_stops_at_once():
    """The first Ctrl-C asks for a save after the step; a second, before the step ends, does not wait."""
    callback = PreemptionCheckpoint(signals=["SIGTERM", "SIGINT"])
    callback.handle(signal.SIGINT, None)
    assert callback.received == signal.SIGINT
    try:
        with pytest.raises(KeyboardInterrupt):
            callback.handle(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_ctrl_c_is_a_preemption_signal_by_default():
    assert "SIGINT" in compose_config([]).callbacks.preemption.signals


@pytest.mark.parametrize("num_workers", [0, 1])
def test_the_loader_replays_an_interrupted_epoch_batch_for_batch(num_workers):
    """A fresh loader given the saved position hands out exactly the rest of the interrupted epoch, and
    leaves the global RNG as the checkpoint had it (the training steps' dropout draws stay in step)."""
    dataset = TensorDataset(torch.arange(12))
    make = functools.partial(
        ResumableDataLoader, dataset, batch_size=2, shuffle=True, num_workers=num_workers
    )
    torch.manual_seed(0)
    loader = make()
    batches = iter(loader)
    seen = [next(batches)[0].tolist() for _ in range(2)]
    saved, rng_at_save = loader.state_dict(), torch.get_rng_state()
    rest = [batch[0].tolist() for batch in batches]

    torch.set_rng_state(rng_at_save)  # what the restored checkpoint does
    resumed = make()
    resumed.load_state_dict(saved)
    replay = iter(resumed)
    assert torch.equal(torch.get_rng_state(), rng_at_save)
    assert [batch[0].tolist() for batch in replay] == rest
    assert sorted(index for batch in seen + rest for index in batch) == list(range(12))


@pytest.mark.parametrize(
    ("env", "job"),
    [({"SLURM_JOB_ID": "42"}, "42"), ({"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"}, "7_3")],
)
def test_slurm_requeue_names_the_job(tmp_path, monkeypatch, env, job):
    record = tmp_path / "scontrol.args"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" > {record}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for key in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    requeue_slurm_job()
    assert record.read_text().split() == ["requeue", job]


def test_unknown_signal_names_the_key():
    with pytest.raises(ValueError, match=r"callbacks\.preemption\.signals=\['SIGTERN'\]: expected"):
        PreemptionCheckpoint(signals=["SIGTERN"])
