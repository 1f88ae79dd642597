"""FastLoader in real training code: Lightning, accelerate, timm, a pytorch/examples-style script.

Each test drives the real package (pinned by the ``integrations`` extra; a test skips,
saying why, only where its package cannot be imported), on the CPU, over a packed
dataset of small solid-colour JPEGs whose pixels encode (label, index)
(``conftest.encode_color``): every batch tells which samples it holds, whatever the
crop, flip or resize. Runs of several processes (Lightning DDP, ``torchrun``) are
scripts in subprocesses with a timeout, so that a hang fails instead of blocking CI.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import IMAGENET_MEAN, IMAGENET_STD, ConfigError, FastLoader

from conftest import decode_batch, encode_color, write_image

TESTS = Path(__file__).resolve().parent
N_CLASSES, PER_CLASS = 3, 14  # 42 samples
N = N_CLASSES * PER_CLASS


def _tree(root: Path, per_class: int = PER_CLASS) -> Path:
    index = 0
    for label in range(N_CLASSES):
        for j in range(per_class):
            write_image(root / f"c{label}" / f"{j:03d}.jpg", encode_color(label, index), size=(48, 40), quality=95)
            index += 1
    return root


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("integrations")
    out = base / "packed"
    fastload.pack(_tree(base / "src"), out, workers=1, progress=False)
    return out


def _loader(packed: Path, batch_size: int = 8, **kw) -> FastLoader:
    kw = {"device": "cpu", "crop": 16, "num_threads": 1, **kw}
    return FastLoader(packed, batch_size, **kw)


def _ids(x: torch.Tensor) -> list[int]:
    """The sample index each image of a normalised batch encodes."""
    return [idx for _, idx in decode_batch(x.float().numpy(), IMAGENET_MEAN, IMAGENET_STD)]


def _check_labels(x: torch.Tensor, y: torch.Tensor) -> None:
    """The label tensor says what the pixels say."""
    got = [lab for lab, _ in decode_batch(x.float().numpy(), IMAGENET_MEAN, IMAGENET_STD)]
    assert got == y.tolist()


def _epoch_ids(loader) -> list[list[int]]:
    out = []
    for x, y in loader:
        _check_labels(x, y)
        out.append(_ids(x))
    return out


def _digest(x: torch.Tensor) -> str:
    return hashlib.sha1(x.contiguous().numpy().tobytes()).hexdigest()


def _run(cmd: list[str], *, env: dict, timeout: float, what: str) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout kill the whole group (workers too) and fail."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{what} did not finish in {timeout} s (a rank waiting on another that yields fewer batches hangs)")
    assert proc.returncode == 0, f"{what} exited with {proc.returncode}:\n{err[-4000:]}"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _env(tmp_path: Path) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
        "FASTLOAD_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
    }


# ============================================================================ Lightning


def _lightning():
    return pytest.importorskip("lightning", reason="lightning is not installed: pip install -e '.[integrations]'")


def _trainer_kwargs(tmp_path: Path) -> dict:
    return {
        "accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False, "default_root_dir": str(tmp_path),
    }  # fmt: skip


def _recorder(L):
    """A LightningModule that records, per epoch, each training batch's samples and exact pixels."""

    class Recorder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3 * 16 * 16, N_CLASSES)
            self.train_batches: list[tuple[int, int, list[int], str]] = []
            self.val_passes: list[tuple[bool, int, list[int]]] = []
            self.epoch_at_start: list[int] = []

        def on_train_epoch_start(self) -> None:
            self.epoch_at_start.append(self.trainer.train_dataloader.epoch)

        def training_step(self, batch, batch_idx):
            x, y = batch
            _check_labels(x, y)
            self.train_batches.append((self.current_epoch, batch_idx, _ids(x), _digest(x)))
            return torch.nn.functional.cross_entropy(self.net(x.flatten(1)), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            _check_labels(x, y)
            sanity = self.trainer.sanity_checking
            if batch_idx == 0:
                self.val_passes.append((sanity, self.current_epoch, []))
            self.val_passes[-1][2].extend(_ids(x))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Recorder


def test_lightning_fit_reads_each_epoch_whole_in_the_loaders_order(packed, tmp_path):
    """Trainer.fit with a train and a val FastLoader: passed through as they are; the probe
    iter() consumes nothing; Lightning's set_epoch reaches the loader; epochs differ."""
    L = _lightning()
    train, val = _loader(packed, 8, seed=7), _loader(packed, 8, train=False)
    calls: list[int] = []
    sampler_set_epoch = train.sampler.set_epoch
    train.sampler.set_epoch = lambda e: (calls.append(e), sampler_set_epoch(e))[-1]  # Lightning looks it up here
    with _loader(packed, 8, seed=7) as ref:
        expect = [_epoch_ids(ref) for _ in range(2)]  # epochs 0 and 1, as the loader alone gives them
    module = _recorder(L)()
    trainer = L.Trainer(**_trainer_kwargs(tmp_path), max_epochs=2)
    trainer.fit(module, train, val)

    assert trainer.train_dataloader is train and trainer.val_dataloaders is val  # not re-instantiated
    got = [[ids for e, _, ids, _ in module.train_batches if e == epoch] for epoch in range(2)]
    assert got == expect  # epoch 0 complete from its first batch: Lightning's probe iter() consumed nothing
    assert expect[0] != expect[1]
    for epoch in got:
        assert sorted(i for ids in epoch for i in ids) == list(range(N))
    assert calls == [0, 1] and module.epoch_at_start == [0, 1]
    # the sanity check reads 2 val batches; each real validation pass reads the whole val set in order
    assert module.val_passes == [(True, 0, list(range(16))), (False, 0, list(range(N))), (False, 1, list(range(N)))]
    train.close()
    val.close()


class _Stop(Exception):
    pass


@pytest.mark.parametrize("stop_at", [3, 6, 8])  # mid-epoch 0, end of epoch 0, mid-epoch 1 (6 batches per epoch)
def test_lightning_resume_from_a_mid_epoch_checkpoint_gives_the_uninterrupted_batches(packed, tmp_path, stop_at):
    """Lightning saves a loader's state_dict() in the checkpoint (fit_loop "combined_loader",
    for every loader with state_dict/load_state_dict) and loads it before iterating: a run
    stopped after ``stop_at`` steps and resumed with ckpt_path reads exactly the batches an
    uninterrupted run reads, pixel for pixel."""
    L = _lightning()
    ckpt = tmp_path / "mid.ckpt"

    class StopAfter(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == stop_at:
                trainer.save_checkpoint(ckpt)
                raise _Stop

    Recorder = _recorder(L)
    kw = {**_trainer_kwargs(tmp_path), "max_epochs": 3, "num_sanity_val_steps": 0}
    ref = Recorder()
    L.Trainer(**kw).fit(ref, _loader(packed, 8, seed=5))
    assert len(ref.train_batches) == 3 * 6

    first = Recorder()
    with pytest.raises(_Stop):
        L.Trainer(**kw, callbacks=[StopAfter()]).fit(first, _loader(packed, 8, seed=5))
    saved = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert [(s["epoch"], s["batches_done"]) for s in saved] == [((stop_at - 1) // 6, (stop_at - 1) % 6 + 1)]

    second = Recorder()
    L.Trainer(**kw).fit(second, _loader(packed, 8, seed=5), ckpt_path=ckpt)
    assert first.train_batches + second.train_batches == ref.train_batches


_LIGHTNING_DDP = '''
import json, sys
import torch
import lightning as L
from fastload import FastLoader
from lightning_support import SeenNet

PACKED, OUT, MODE = sys.argv[1], sys.argv[2], sys.argv[3]


def make_loader():
    return FastLoader(PACKED, 4, device="cpu", crop=16, num_threads=1, seed=3)


class Net(SeenNet):
    def on_train_end(self):
        dl = self.trainer.train_dataloader
        record = {"seen": self.seen, "rank": dl.rank, "world_size": dl.world_size, "len": len(dl)}
        with open(f"{OUT}/rank{self.trainer.global_rank}.json", "w") as f:
            json.dump(record, f)


class FromHook(Net):
    def train_dataloader(self):  # called after the process group exists
        return make_loader()


def main():
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=sys.argv[4], max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=OUT)
    if MODE == "hook":
        trainer.fit(FromHook())
    else:  # made at the top of the script, before Trainer.fit starts the processes and the group
        trainer.fit(Net(), make_loader())


if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize(
    "mode, strategy",
    [
        ("fit-argument", "ddp"),
        pytest.param("hook", "ddp", marks=pytest.mark.slow),
        pytest.param("fit-argument", "ddp_spawn", marks=pytest.mark.slow),
    ],
)
def test_lightning_ddp_two_ranks_read_disjoint_equal_shares(packed, tmp_path, mode, strategy):
    """Trainer(strategy="ddp"/"ddp_spawn", devices=2) on CPU (gloo): each rank reads an equal,
    disjoint share of every epoch, whether the loader comes from ``train_dataloader()`` or was
    built before ``fit`` and passed to it (Lightning leaves a non-DataLoader as it is, so the
    loader itself must find the process group)."""
    _lightning()
    script = tmp_path / "lightning_ddp.py"
    script.write_text(_LIGHTNING_DDP)
    out = tmp_path / "out"
    out.mkdir()
    _run([sys.executable, str(script), str(packed), str(out), mode, strategy], env=_env(tmp_path), timeout=420,
         what=f"Lightning {strategy} with 2 CPU ranks")  # fmt: skip
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(d["rank"], d["world_size"]) for d in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["len"] == ranks[1]["len"] == 6  # 21 samples per rank in batches of 4
    for epoch in ("0", "1"):
        a, b = ranks[0]["seen"][epoch], ranks[1]["seen"][epoch]
        assert len(a) == len(b) == N // 2
        assert not set(a) & set(b) and set(a) | set(b) == set(range(N))
    assert ranks[0]["seen"]["0"] != ranks[0]["seen"]["1"]


# ============================================================================ accelerate


def _accelerate():
    return pytest.importorskip("accelerate", reason="accelerate is not installed: pip install -e '.[integrations]'")


def test_accelerate_prepare_leaves_fastloader_as_is_and_trains(packed):
    """accelerate prepares DataLoaders only: a FastLoader comes back unchanged (not wrapped,
    not sharded, batches not moved) and a training epoch on it works."""
    accelerate = _accelerate()
    acc = accelerate.Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3 * 16 * 16, N_CLASSES)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = _loader(packed, 8, seed=1)
    model, opt, prepared = acc.prepare(model, opt, loader)
    assert prepared is loader
    seen, losses = [], []
    for x, y in prepared:
        _check_labels(x, y)
        loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        seen += _ids(x)
        losses.append(loss.item())
    assert sorted(seen) == list(range(N)) and len(losses) == len(loader) == 6
    assert all(np.isfinite(losses)) and not torch.equal(before, model.weight.detach())
    assert loader.epoch == 1  # a finished epoch moves the loader on
    loader.close()


@pytest.mark.parametrize("train", [True, False])
def test_accelerate_skip_first_batches_yields_exactly_the_rest_of_the_epoch(packed, train):
    """skip_first_batches(loader, k) builds a torch DataLoader over loader.dataset with
    loader.batch_sampler minus its first k batches: the same samples in the same batches,
    processed on the CPU by the dataset view."""
    accelerate = _accelerate()
    acc = accelerate.Accelerator(cpu=True)
    loader = _loader(packed, 8, seed=2, train=train, shuffle=True)
    loader.set_epoch(1)
    full = [(x, y) for x, y in loader]
    loader.set_epoch(1)
    rest = acc.skip_first_batches(loader, 2)
    assert isinstance(rest, torch.utils.data.DataLoader) and len(rest) == len(loader) - 2 == 4
    got = [(x, y) for x, y in rest]
    assert [_ids(x) for x, _ in got] == [_ids(x) for x, _ in full[2:]]
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in full[2:]]
    for (a, _), (b, _) in zip(got, full[2:]):
        assert a.shape == b.shape and a.dtype == b.dtype
        if not train:  # evaluation: no random parameters, the CPU view matches the loader
            assert torch.allclose(a, b, atol=0.05)
    loader.close()


def test_accelerate_save_state_load_state_resumes_the_loader(packed, tmp_path):
    """register_for_checkpointing(loader): save_state stores loader.state_dict() and
    load_state restores it; the new loader yields exactly the rest of the epoch."""
    accelerate = _accelerate()
    with _loader(packed, 8, seed=4) as ref:
        ref.set_epoch(1)
        expect = [(_digest(x), y.tolist()) for x, y in ref]
    a = _loader(packed, 8, seed=4)
    acc = accelerate.Accelerator(cpu=True)
    acc.register_for_checkpointing(a)
    a.set_epoch(1)
    it = iter(a)
    first = [(_digest(x), y.tolist()) for x, y in (next(it) for _ in range(3))]
    acc.save_state(str(tmp_path / "state"))
    a.close()

    b = _restored_through_accelerate(accelerate, tmp_path / "state", _loader(packed, 8, seed=4))
    assert (b.state_dict()["epoch"], b.state_dict()["batches_done"]) == (1, 3)
    rest = [(_digest(x), y.tolist()) for x, y in b]
    assert first + rest == expect
    assert b.epoch == 2
    b.close()


def _restored_through_accelerate(accelerate, state_dir, loader):
    """``loader`` with the state a checkpoint in ``state_dir`` holds, restored by accelerate's own ``load_state``."""
    acc = accelerate.Accelerator(cpu=True)
    acc.register_for_checkpointing(loader)
    acc.load_state(str(state_dir))
    return loader


def test_resumed_loader_keeps_its_position_when_the_loop_sets_the_same_epoch(packed, tmp_path):
    """The usual resume loop: load_state, then ``for epoch in range(start_epoch, ...):
    loader.set_epoch(epoch)``. Setting the epoch the loader already stands in (what
    DistributedSampler.set_epoch does: nothing) must not throw away the restored position."""
    accelerate = _accelerate()
    with _loader(packed, 8, seed=4) as ref:
        expect = [[(_digest(x), y.tolist()) for x, y in ref] for _ in range(3)]
    a = _loader(packed, 8, seed=4)
    acc = accelerate.Accelerator(cpu=True)
    acc.register_for_checkpointing(a)
    for _ in a:  # epoch 0
        pass
    it = iter(a)
    for _ in range(2):
        next(it)
    acc.save_state(str(tmp_path / "state"))
    a.close()

    b = _restored_through_accelerate(accelerate, tmp_path / "state", _loader(packed, 8, seed=4))
    start_epoch = b.state_dict()["epoch"]
    got = []
    for epoch in range(start_epoch, 3):
        b.set_epoch(epoch)
        got.append([(_digest(x), y.tolist()) for x, y in b])
    assert got == [expect[1][2:], expect[2]]
    b.close()


# ============================================================================ elastic resume (world size changes)

_LIGHTNING_ELASTIC = '''
import json, sys
import torch
import lightning as L
from fastload import FastLoader
from lightning_support import SeenNet

PACKED, OUT, MODE, CKPT, DEVICES, BATCH, STEPS = sys.argv[1:8]
DEVICES, BATCH, STEPS = int(DEVICES), int(BATCH), int(STEPS)


class Net(SeenNet):
    def on_train_end(self):
        with open(f"{OUT}/{MODE}-rank{self.trainer.global_rank}.json", "w") as f:
            json.dump({"seen": self.seen, "len": len(self.trainer.train_dataloader)}, f)


class SaveAt(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == STEPS:
            trainer.save_checkpoint(CKPT)


def run(mode=MODE):
    kw = dict(accelerator="cpu", devices=DEVICES, strategy="ddp" if DEVICES > 1 else "auto", logger=False,
              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              num_sanity_val_steps=0, default_root_dir=OUT)
    loader = FastLoader(PACKED, BATCH, device="cpu", crop=16, num_threads=1, seed=3)
    if mode == "save":
        L.Trainer(**kw, max_steps=STEPS, callbacks=[SaveAt()]).fit(Net(), loader)
    else:
        L.Trainer(**kw, max_epochs=3).fit(Net(), loader, ckpt_path=CKPT)


if __name__ == "__main__":
    run()
'''


def _lightning_elastic(tmp_path: Path, packed: Path, mode: str, devices: int, batch: int, steps: int) -> list[dict]:
    script = tmp_path / "lightning_elastic.py"
    script.write_text(_LIGHTNING_ELASTIC)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    args = [str(packed), str(out), mode, str(tmp_path / "mid.ckpt"), str(devices), str(batch), str(steps)]
    _run([sys.executable, str(script), *args], env=_env(tmp_path), timeout=420, what=f"Lightning {mode} on {devices} rank(s)")
    return [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(devices)]


def _fresh_epoch_ids(packed: Path, batch: int, world: int, epoch: int, seed: int) -> list[list[int]]:
    out = []
    for r in range(world):
        with _loader(packed, batch, seed=seed, rank=r, world_size=world) as ref:
            ref.set_epoch(epoch)
            out.append([i for ids in _epoch_ids(ref) for i in ids])
    return out


def _exactly_once(*parts: list[int]) -> None:
    """The parts together hold every sample once, plus at most one padding repeat per part."""
    flat = [i for p in parts for i in p]
    assert set(flat) == set(range(N)) and len(flat) - N <= len(parts)


@pytest.mark.parametrize("saved_on", [pytest.param(2, marks=pytest.mark.slow), 1])  # about 24 s and 14 s
def test_lightning_checkpoint_saved_on_one_world_resumes_on_the_other(packed, tmp_path, saved_on):
    """Lightning's own checkpoint (fit_loop "combined_loader" holds rank 0's loader state) saved
    mid-epoch 1 on 2 DDP ranks resumes on 1 device, and one saved on 1 device resumes on 2: the
    interrupted epoch reads every sample once (padding aside), the next epoch is an uninterrupted
    run's on the new world. The global batch stays 8 (2 x 4 or 1 x 8): Lightning counts the
    steps already taken in the epoch and ends it at len(loader)."""
    _lightning()
    if saved_on == 2:
        before = _lightning_elastic(tmp_path, packed, "save", 2, 4, steps=6 + 2)  # 6 steps per epoch, then 2
        after = _lightning_elastic(tmp_path, packed, "resume", 1, 8, steps=0)
    else:
        before = _lightning_elastic(tmp_path, packed, "save", 1, 8, steps=6 + 2)
        after = _lightning_elastic(tmp_path, packed, "resume", 2, 4, steps=0)
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert [(s["epoch"], s["batches_done"], s["samples_consumed"]) for s in saved] == [(1, 2, 16)]
    assert all(len(b["seen"]["1"]) == 16 // saved_on for b in before)
    _exactly_once(*(b["seen"]["1"] for b in before), *(a["seen"]["1"] for a in after))
    world = 3 - saved_on
    assert [a["seen"]["2"] for a in after] == _fresh_epoch_ids(packed, 8 // world, world, 2, seed=3)


def _dist_worker(tmp_path: Path, packed: Path, ranks: int, mode: str, batch: int) -> list[dict]:
    out = tmp_path / f"out-{mode}"
    out.mkdir()
    worker = [str(TESTS / "dist_worker.py"), str(packed), str(out), mode, str(tmp_path / "state"), str(batch)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *worker]
    _run(cmd, env=_env(tmp_path), timeout=420, what=f"torchrun {mode} on {ranks} ranks")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.mark.slow  # long; the opposite direction stays fast
def test_torchrun_two_ranks_save_accelerate_state_and_one_process_resumes(packed, tmp_path):
    """``torchrun --nproc_per_node=2``: accelerate's save_state stores rank 0's loader state (the
    same on both ranks) after 2 batches of epoch 1 per rank; one process load_states it and reads
    the 26 samples the two ranks had not read, then epoch 2 exactly as a 1-process run."""
    accelerate = _accelerate()
    ranks = _dist_worker(tmp_path, packed, 2, "save", 4)
    assert ranks[0]["state"] == ranks[1]["state"] and ranks[0]["state"]["samples_consumed"] == 16
    b = _loader(packed, 4, seed=7)
    acc = accelerate.Accelerator(cpu=True)
    acc.register_for_checkpointing(b)
    acc.load_state(str(tmp_path / "state"))
    got = {}
    for epoch in range(b.epoch, 3):
        b.set_epoch(epoch)
        got[epoch] = [i for ids in _epoch_ids(b) for i in ids]
    b.close()
    assert sorted(got) == [1, 2] and len(got[1]) == N - 16
    _exactly_once(ranks[0]["1"], ranks[1]["1"], got[1])
    assert [got[2]] == _fresh_epoch_ids(packed, 4, 1, 2, seed=7)


def test_accelerate_state_saved_by_one_process_resumes_on_two_torchrun_ranks(packed, tmp_path):
    """The reverse: one process saves after 2 batches of 8; under torchrun 2 ranks of batch 4
    load_state it, share the 26 samples left (13 each, 4 batches each, all_reduce per batch),
    and read epoch 2 as an uninterrupted 2-rank run."""
    accelerate = _accelerate()
    a = _loader(packed, 8, seed=7)
    acc = accelerate.Accelerator(cpu=True)
    acc.register_for_checkpointing(a)
    a.set_epoch(1)
    it = iter(a)
    first = [i for _ in range(2) for i in _ids(next(it)[0])]
    acc.save_state(str(tmp_path / "state"))
    a.close()
    ranks = _dist_worker(tmp_path, packed, 2, "resume", 4)
    assert [len(r["1"]) for r in ranks] == [13, 13]
    _exactly_once(first, ranks[0]["1"], ranks[1]["1"])
    assert [r["2"] for r in ranks] == _fresh_epoch_ids(packed, 4, 2, 2, seed=7)


# ============================================================================ timm


def _timm():
    return pytest.importorskip("timm", reason="timm is not installed: pip install -e '.[integrations]'")


def _timm_set_loader_epoch(loader, epoch: int) -> None:
    """What timm's train.py does at the start of every epoch (its ``_set_loader_epoch``): a
    dataset with ``set_epoch`` gets it; then the batch sampler's ``set_epoch`` if it has
    one, otherwise the sampler's."""
    dataset = getattr(loader, "dataset", None)
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    batch_sampler, sampler = getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)
    if hasattr(batch_sampler, "set_epoch"):
        batch_sampler.set_epoch(epoch)
    elif hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
def test_timm_mixup_over_an_epoch_with_drop_last(packed, mode):
    """timm.data.Mixup needs even batches: drop_last=True gives 5 full batches of 8 (2 of
    the 42 samples dropped); Mixup mixes each image with its mirror in the batch, in place,
    and the soft targets carry the same weights."""
    _timm()
    from timm.data import Mixup

    mix = Mixup(mixup_alpha=1.0, cutmix_alpha=0.0, prob=1.0, mode=mode, num_classes=N_CLASSES, label_smoothing=0.0)
    np.random.seed(0)  # timm draws its weights from NumPy's global generator
    loader = _loader(packed, 8, seed=6, drop_last=True)
    assert len(loader) == 5
    seen, mixed = [], 0
    for x, y in loader:
        assert x.shape[0] == 8
        _check_labels(x, y)
        seen += _ids(x)
        original = x.clone()
        xm, ym = mix(x, y)
        assert xm.data_ptr() == x.data_ptr()  # timm mixes in place: the loader's tensors are the user's own
        mirror = original.flip(0)
        onehot = torch.nn.functional.one_hot(y, N_CLASSES).float()
        # per image: x' = lam * x + (1 - lam) * mirror; the target has the same lam
        d = (original - mirror).flatten(1)
        for i in range(8):
            if d[i].abs().max() < 1e-3:
                continue  # an image mixed with an identical one: lam cannot be read back
            lam = float(((xm[i] - mirror[i]).flatten() @ d[i]) / (d[i] @ d[i]))
            assert torch.allclose(xm[i], lam * original[i] + (1 - lam) * mirror[i], atol=1e-4)
            expect = lam * onehot[i] + (1 - lam) * onehot.flip(0)[i]
            assert torch.allclose(ym[i], expect, atol=1e-4), (i, lam, ym[i], expect)
            mixed += lam < 0.999
    assert len(seen) == len(set(seen)) == 40
    assert mixed > 0  # mixup did mix (alpha=1: lam ~ Beta(1, 1))
    loader.close()


def test_timm_set_loader_epoch_reaches_fastloader_and_a_user_sampler(packed):
    """timm's per-epoch set_epoch logic: without ``sampler=`` it finds loader.batch_sampler's
    set_epoch, which sets the loader's epoch; with a DistributedSampler it falls through to
    loader.sampler (a plain BatchSampler has none), and FastLoader reads that sampler's indices."""
    _timm()
    from timm.data.loader import PrefetchLoader

    loader = _loader(packed, 8, seed=8)
    orders = {}
    for epoch in (0, 1, 0):
        _timm_set_loader_epoch(loader, epoch)
        assert loader.epoch == epoch
        orders.setdefault(epoch, []).append(_epoch_ids(loader))
    assert orders[0][0] == orders[0][1] != orders[1][0]
    # through timm's PrefetchLoader, which forwards sampler / batch_sampler / dataset
    _timm_set_loader_epoch(PrefetchLoader(loader, device=torch.device("cpu")), 1)
    assert loader.epoch == 1 and _epoch_ids(loader) == orders[1][0]
    loader.close()

    ds = torch.utils.data.DistributedSampler(range(N), num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = _loader(packed, 4, sampler=ds)
    for epoch in (0, 1):
        _timm_set_loader_epoch(loader, epoch)
        assert ds.epoch == epoch
        expect = list(ds)
        assert [i for b in _epoch_ids(loader) for i in b] == expect
    loader.close()


def test_timm_prefetch_loader_over_a_uint8_fastloader(packed):
    """timm's PrefetchLoader takes uint8 batches and normalises them itself: a FastLoader with
    mean=None, std=None feeds it, giving what a normalising FastLoader gives. timm's
    FastCollateMixup is a collate_fn, which FastLoader refuses with a ConfigError."""
    _timm()
    from timm.data import FastCollateMixup
    from timm.data.loader import PrefetchLoader

    raw = _loader(packed, 8, seed=9, mean=None, std=None, train=False, shuffle=True)
    ref = _loader(packed, 8, seed=9, train=False, shuffle=True)
    prefetch = PrefetchLoader(raw, mean=IMAGENET_MEAN, std=IMAGENET_STD, device=torch.device("cpu"))
    assert len(prefetch) == len(ref) == 6 and prefetch.mixup_enabled is False  # reads loader.collate_fn
    pairs = list(zip(prefetch, ref))
    assert len(pairs) == 6
    for (a, ya), (b, yb) in pairs:
        assert a.dtype == torch.float32 and torch.allclose(a, b, atol=1e-4) and torch.equal(ya, yb)
    raw.close()
    ref.close()
    with pytest.raises(ConfigError, match="collate_fn=FastCollateMixup"):
        _loader(packed, 8, collate_fn=FastCollateMixup(mixup_alpha=1.0, num_classes=N_CLASSES))


# ============================================================================ what clients copy


def test_dataset_view_and_samplers_pickle_like_a_dataloaders(packed):
    """Clients pickle what a loader exposes: a DataLoader over ``Subset(loader.dataset, ...)``
    with workers under spawn/forkserver (macOS, Windows, Linux from Python 3.14), a launcher
    or ``copy.deepcopy`` copying the samplers. The copies give what the originals give."""
    import copy
    import pickle

    loader = _loader(packed, 8, seed=3)
    loader.set_epoch(2)
    view = pickle.loads(pickle.dumps(loader.dataset))
    for i in (0, 17, N - 1):
        a, la = loader.dataset[i]
        b, lb = view[i]
        assert la == lb and torch.equal(a, b)
    for sampler in (loader.sampler, loader.batch_sampler):
        assert list(pickle.loads(pickle.dumps(sampler))) == list(sampler)
        assert list(copy.deepcopy(sampler)) == list(sampler)
    loader.close()


@pytest.mark.slow
def test_subset_of_loader_dataset_in_a_spawn_dataloader(packed):
    """pytorch/examples evaluates the remainder of a distributed validation with
    ``DataLoader(Subset(val_loader.dataset, ...), num_workers=...)``; under the spawn start
    method the workers receive the dataset pickled."""
    loader = _loader(packed, 4, train=False)
    dl = torch.utils.data.DataLoader(
        torch.utils.data.Subset(loader.dataset, range(30, N)), batch_size=4, num_workers=1, multiprocessing_context="spawn"
    )
    got = [(_ids(x), y.tolist()) for x, y in dl]
    assert [i for ids, _ in got for i in ids] == list(range(30, N))
    assert [lab for _, y in got for lab in y] == [i // PER_CLASS for i in range(30, N)]
    loader.close()


# ============================================================================ pytorch/examples imagenet


TRAIN_N, VAL_PER_CLASS = N, 5  # 42 training images; 15 validation images (odd: 2 ranks leave one out)


@pytest.fixture
def imagenet_dir(tmp_path) -> Path:
    pytest.importorskip("torchvision", reason="torchvision is not installed: pip install -e '.[bench]'")
    root = tmp_path / "imagenet"
    _tree(root / "train")
    _tree(root / "val", per_class=VAL_PER_CLASS)
    return root


def _imagenet(tmp_path: Path, data: Path, ranks: int, *extra: str) -> list[dict]:
    script = TESTS / "imagenet_style.py"
    record = tmp_path / "record"
    args = [str(script), str(data), "--steps", "2", "-b", "4", "-j", "2", "--record", str(record), *extra]
    if ranks == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *args]
    _run(cmd, env=_env(tmp_path), timeout=420, what=f"imagenet_style.py on {ranks} rank(s)")
    return [json.loads(Path(f"{record}.rank{r}.json").read_text()) for r in range(ranks)]


def _val_indices(part: list[dict]) -> list[int]:
    assert all(p["index"] // VAL_PER_CLASS == p["label"] for p in part)  # label tensor == pixels
    return [p["index"] for p in part]


def test_imagenet_style_script_one_process(tmp_path, imagenet_dir):
    """``python imagenet_style.py``: FastLoader(ImageFolder, batch_size, shuffle=True,
    num_workers, pin_memory=True, sampler=None) trains 2 steps on shuffled, distinct samples;
    the validation pass reads the 15 images in order, and the accuracy counts all 15."""
    (rec,) = _imagenet(tmp_path, imagenet_dir, 1)
    assert (rec["rank"], rec["world_size"], rec["train_len"]) == (0, 1, 11)
    assert rec["classes"] == ["c0", "c1", "c2"]
    steps = rec["train"]["0"]
    assert [s["batch"] for s in steps] == [4, 4]
    ids = [i for s in steps for i in s["indices"]]
    assert len(set(ids)) == 8 and ids != list(range(8))  # shuffled
    assert all(i // PER_CLASS == lab for s in steps for i, lab in zip(s["indices"], s["labels"]))
    val = rec["val"]["0"]
    assert _val_indices(val["main"]) == list(range(3 * VAL_PER_CLASS)) and val["rest"] == []
    assert (val["sampler_len"], val["dataset_len"], val["evaluated"], val["progress_total"]) == (15, 15, 15, 4)


def test_imagenet_style_script_under_torchrun_two_ranks(tmp_path, imagenet_dir):
    """``torchrun --nproc_per_node=2`` (gloo): FastLoader(sampler=DistributedSampler) reads
    exactly that sampler's indices for the epoch set_epoch chose; validation covers 14 images
    through the samplers (len(val_loader.sampler) == 7 each) and the 15th through
    Subset(val_loader.dataset, range(14, 15)) in a plain DataLoader with 2 workers."""
    ranks = _imagenet(tmp_path, imagenet_dir, 2, "--epochs", "2")
    val_main = []
    for r, rec in enumerate(ranks):
        assert (rec["rank"], rec["world_size"], rec["train_len"]) == (r, 2, 6)  # 21 samples per rank
        for epoch in (0, 1):
            sampler = torch.utils.data.DistributedSampler(range(TRAIN_N), num_replicas=2, rank=r)
            sampler.set_epoch(epoch)
            steps = rec["train"][str(epoch)]
            assert [i for s in steps for i in s["indices"]] == list(sampler)[:8]
            assert all(i // PER_CLASS == lab for s in steps for i, lab in zip(s["indices"], s["labels"]))
        val = rec["val"]["0"]
        assert _val_indices(val["main"]) == list(range(r, 14, 2))
        assert _val_indices(val["rest"]) == [14]
        assert (val["sampler_len"], val["dataset_len"], val["evaluated"], val["progress_total"]) == (7, 15, 15, 3)
        val_main += _val_indices(val["main"])
    assert sorted(val_main) == list(range(14))
    a, b = ([i for s in rec["train"]["0"] for i in s["indices"]] for rec in ranks)
    assert not set(a) & set(b)
