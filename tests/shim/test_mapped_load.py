"""A plain checkpoint member restored into live tensors (mapped_load): the restore through init()
is exact and copies into the model's own tensors; what differs from the live structure is cloned;
an optimizer whose hyper-parameters differ gets its tensors filled and its values from the file;
and no mapping of the checkpoint file outlives the restore (it would pin a deleted checkpoint's
disk space for the life of the process)."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

import trainer_shim
from trainer_shim._restore import read
from trainer_shim import rundir


def _mapped(path: Path) -> list[str]:
    """Lines of this process's memory map that name a file under `path`."""
    return [ln for ln in Path("/proc/self/maps").read_text().splitlines() if str(path) in ln]


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    return model, opt


def _saved(tmp_path: Path) -> tuple[Path, dict, dict]:
    model, opt = _trained(0)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=tmp_path / "run", save_on_epoch_end=False)
    run.global_step = 3
    path = run.save()
    run.finish()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    return path, want, opt.state_dict()


def test_a_restore_through_init_fills_the_models_own_tensors_exactly_and_maps_nothing(tmp_path: Path) -> None:
    path, want, want_opt = _saved(tmp_path)
    model, opt = _trained(1)   # other weights, and optimizer state of the same shapes
    weight = model[0].weight
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=tmp_path / "run", save_on_epoch_end=False)
    assert run.global_step == 3
    assert model[0].weight is weight
    assert all(torch.equal(want[k], v) for k, v in model.state_dict().items())
    got_opt = opt.state_dict()
    for i, st in want_opt["state"].items():
        assert all(torch.equal(v, got_opt["state"][i][k]) for k, v in st.items())
    assert got_opt["param_groups"] == want_opt["param_groups"]
    run.finish()
    gc.collect()
    assert not _mapped(path), _mapped(path)


def test_a_live_state_of_another_structure_is_untouched_and_gets_clones(tmp_path: Path) -> None:
    path, want, _ = _saved(tmp_path)
    other = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))   # no BatchNorm
    live = other.state_dict()
    before = {k: v.clone() for k, v in live.items()}
    _, files = read.read_checkpoint(path, names=[rundir.MODEL_FILE], into={rundir.MODEL_FILE: live})
    got = files[rundir.MODEL_FILE]
    assert got is not live and all(torch.equal(before[k], v) for k, v in live.items())
    assert got.keys() == want.keys() and all(torch.equal(want[k], v) for k, v in got.items())
    assert not _mapped(path), "a returned tensor still maps the checkpoint file"
    del got, files
    gc.collect()
    assert not _mapped(path)


def test_load_of_a_finished_run_fills_the_model_and_optimizer_in_place(tmp_path: Path) -> None:
    path, want, want_opt = _saved(tmp_path)
    model, opt = _trained(1)
    weight, moment = model[0].weight, opt.state_dict()["state"][0]["exp_avg"]
    res = trainer_shim.load(tmp_path / "run", model, optimizer=opt)
    assert res.path == path and model[0].weight is weight
    assert all(torch.equal(want[k], v) for k, v in model.state_dict().items())
    got_opt = opt.state_dict()
    assert got_opt["state"][0]["exp_avg"] is moment
    for i, st in want_opt["state"].items():
        assert all(torch.equal(v, got_opt["state"][i][k]) for k, v in st.items())
    del res
    gc.collect()
    assert not _mapped(path), _mapped(path)
