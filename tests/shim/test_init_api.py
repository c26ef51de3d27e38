"""The public API shows itself: init()'s keywords are a real signature derived from the one declaration
of the options, and __all__ is what users import."""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from pathlib import Path

import pytest

import trainer_shim
from tests.docs import gen_reference as load_generators
from trainer_shim._loop import options
from trainer_shim._loop.options import Options

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_init_signature_lists_every_option_with_its_default() -> None:
    params = inspect.signature(trainer_shim.init).parameters
    fields = {f.name: f.default for f in dataclasses.fields(Options)}
    assert list(params) == list(fields)
    for name, p in params.items():
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert p.default == fields[name], name
        assert p.annotation is not inspect.Parameter.empty, name


def test_help_shows_every_option_with_its_default_and_what_it_does() -> None:
    text = inspect.getdoc(trainer_shim.init) or ""
    for f in dataclasses.fields(Options):
        assert f"    {f.name}={f.default!r}: {f.metadata['doc']}" in text.splitlines(), f.name
    assert inspect.signature(trainer_shim.init).parameters["keep_last"].default == 3


def test_the_options_are_declared_once() -> None:
    """init() and Run take **options: the only list of option names is Options."""
    for fn in (trainer_shim.init, trainer_shim.Run.__init__):
        assert re.search(r"def \w+\((self, )?\*\*\w+: Any\)", inspect.getsource(fn)), fn
    # The docs' table is options.table() itself, rendered when the site is built (docs/gen_reference.py);
    # tests/docs/test_docs_site.py checks that every option reaches the built site.
    assert "<!-- gen:init-options -->" in (DOCS / "reference" / "options.md").read_text()
    gen_reference = load_generators()
    assert gen_reference.render("<!-- gen:init-options -->") == options.table().replace("<", "&lt;")


def test_save_every_steps_auto_still_works_with_a_deprecation_warning(tmp_path) -> None:
    with pytest.warns(DeprecationWarning, match="save_every_seconds='auto'") as caught:
        run = trainer_shim.init(save_every_steps="auto", run_dir=tmp_path)
    assert caught[0].filename == __file__   # pointed at the caller's line
    assert run.save_every_seconds is not None
    run.finish()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer_shim.init(save_every_seconds="auto", run_dir=tmp_path / "b").finish()


def test_a_bad_option_is_a_type_error_like_any_function(tmp_path) -> None:
    with pytest.raises(TypeError, match="unknown option 'keep_lsat'; did you mean 'keep_last'"):
        trainer_shim.init(keep_lsat=2, run_dir=tmp_path)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        trainer_shim.init(None)  # type: ignore[misc]  # keywords only
    assert not (tmp_path / "checkpoints").exists()  # nothing touched the run dir


def test_all_is_importable_and_curated() -> None:
    for name in trainer_shim.__all__:
        assert getattr(trainer_shim, name) is not None, name
    assert {"init", "load", "Run", "ShimError", "CheckpointError"} <= set(trainer_shim.__all__)
    assert "rundir" not in trainer_shim.__all__ and trainer_shim.rundir.RunDir  # importable for tools
    assert not any(n.startswith("_") for n in trainer_shim.__all__)
    exec("from trainer_shim import *", {})


def test_every_exception_a_user_can_meet_is_exported() -> None:
    from trainer_shim import errors

    raised = {name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, Exception)}
    assert raised <= set(trainer_shim.__all__)


_IMPORTED = r"""
import json, sys
import torch
import trainer_shim
model = torch.nn.Linear(2, 2)
run = trainer_shim.init(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), run_dir=sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("trainer_shim"))))
"""


def test_a_default_init_loads_no_extra(tmp_path: Path) -> None:
    """With default options init() imports no memory-slot, prefault, late-copy, async or doctor module."""
    import json
    import subprocess

    from tests.conftest import PYTHON, REPO, child_env

    env = child_env(PYTHONPATH=str(REPO))
    env.pop("RESILIENT_SHM_DIR", None)   # a user's default: /dev/shm, nothing to check at init()
    p = subprocess.run([PYTHON, "-c", _IMPORTED, str(tmp_path / "run")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    loaded = json.loads(p.stdout.strip().splitlines()[-1])
    extras = [m for m in loaded if m.startswith(("trainer_shim._memory", "trainer_shim._insight"))
              or m in ("trainer_shim._restore.landing", "trainer_shim._restore.slot_maps",
                       "trainer_shim._restore.raw_read", "trainer_shim.rundir.snapshots", "trainer_shim.rundir.slot_memory")]
    assert extras == [], extras
    # A fresh start reads and writes no checkpoint yet: the save path, the restore's apply and the data
    # position load with the first save, restore and training stream (the small-shim goal: <= 35).
    later = [m for m in loaded if m.startswith(("trainer_shim._disk", "trainer_shim._state"))
             or m in ("trainer_shim._restore.apply", "trainer_shim._restore.read", "trainer_shim.rundir.commit",
                      "trainer_shim._session.distributed", "trainer_shim._loop.resume_prompt",
                      "trainer_shim._policies.save_interval")]
    assert later == [], later
    assert len(loaded) <= 35, loaded
