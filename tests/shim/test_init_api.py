"""The public API shows itself: init()'s keywords are a real signature, and __all__ is what users import."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import trainer_shim
from trainer_shim._loop.options import Options


def test_init_signature_lists_every_option_with_its_default() -> None:
    params = inspect.signature(trainer_shim.init).parameters
    fields = {f.name: f.default for f in dataclasses.fields(Options)}
    assert list(params) == list(fields)
    for name, p in params.items():
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert p.default == fields[name], name
        assert p.annotation is not inspect.Parameter.empty, name


def test_help_shows_the_options() -> None:
    text = inspect.getdoc(trainer_shim.init) or ""
    shown = str(inspect.signature(trainer_shim.init))
    assert "save_every_steps: 'Optional[Union[int, str]]' = None" in shown and "keep_last: 'int' = 3" in shown
    assert "save_every_steps" in text


def test_a_bad_option_is_a_type_error_like_any_function(tmp_path) -> None:
    with pytest.raises(TypeError, match="keep_lsat"):
        trainer_shim.init(keep_lsat=2, run_dir=tmp_path)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        trainer_shim.init(None)  # type: ignore[misc]  # keywords only
    assert not (tmp_path / "checkpoints").exists()  # nothing touched the run dir


def test_all_is_importable_and_curated() -> None:
    for name in trainer_shim.__all__:
        assert getattr(trainer_shim, name) is not None, name
    assert {"init", "load", "Run", "ShimError", "CheckpointError"} <= set(trainer_shim.__all__)
    assert not any(n.startswith("_") for n in trainer_shim.__all__)
    exec("from trainer_shim import *", {})
