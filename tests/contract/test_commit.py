"""The one commit protocol, the one trash-then-delete and the one chooser, without torch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer_shim.rundir import (
    LATEST, RESUME_NONE, CheckpointKind, InvalidCheckpoint, Manifest, checkpoint_name, choose, commit, digest_file,
    inspect_checkpoint,
)


def _commit(root: Path, step: int, payload: bytes, *, exact: bool = True) -> Path:
    tmp = commit.fresh_tmp_dir(root, checkpoint_name(step))
    (tmp / "model.bin").write_bytes(payload)
    manifest = Manifest.create(commit.hash_tree(tmp), step=step, epoch=0, batch_in_epoch=step,
                               kind=CheckpointKind.STEP, loss=None, exact=exact)
    final = root / checkpoint_name(step)
    commit.commit_dir(tmp, final, manifest.to_bytes(), repoint=exact)
    return final


def test_a_commit_is_one_valid_dir_named_by_latest_and_a_recommit_supersedes_it(tmp_path: Path) -> None:
    first = _commit(tmp_path, 3, b"a" * 10)
    assert inspect_checkpoint(first, full=True).manifest.files["model.bin"].size == 10
    assert os.readlink(tmp_path / LATEST) == first.name
    again = _commit(tmp_path, 3, b"b" * 20)
    assert again == first and inspect_checkpoint(again, full=True).manifest.files["model.bin"].size == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, first.name]  # no tmp, no superseded dir
    _commit(tmp_path, 4, b"c", exact=False)
    assert os.readlink(tmp_path / LATEST) == first.name  # an inexact save is never `latest`


def test_discard_renames_out_of_sight_before_deleting(tmp_path: Path) -> None:
    doomed = _commit(tmp_path, 5, b"x")
    seen = []
    commit.discard(doomed, then=lambda: seen.append(sorted(p.name for p in tmp_path.iterdir())))
    assert seen == [[commit.tmp_dir(tmp_path, "deleting-" + doomed.name).name, LATEST]]
    assert not doomed.exists() and not commit.tmp_dir(tmp_path, "deleting-" + doomed.name).exists()
    t = commit.discard(_commit(tmp_path, 6, b"y"), background=True)
    assert t is not None
    t.join()
    assert [p.name for p in tmp_path.iterdir()] == [LATEST]


def test_choose_takes_the_supervisors_pick_else_the_newest_valid_below_it(tmp_path: Path) -> None:
    old, new = _commit(tmp_path, 1, b"1"), _commit(tmp_path, 2, b"2")
    assert choose([tmp_path], None).path == new
    assert choose([tmp_path], str(old)).path == old
    assert choose([tmp_path], RESUME_NONE) is None
    (new / "model.bin").write_bytes(b"22")  # torn: the pick is rejected, the next older one taken
    rejected: list = []
    info = choose([tmp_path], str(new), on_reject=lambda p, r: rejected.append((p.name, r)))
    assert info is not None and info.path == old
    assert rejected == [(new.name, "model.bin has 2 bytes, manifest says 1 (truncated?)")]


def test_copy_verified_copies_in_the_kernel_or_hashing_and_refuses_a_changed_source(tmp_path: Path) -> None:
    # More than one 16 MiB piece, so the loop, its progress and the digest run over several pieces.
    data = os.urandom(1 << 20) * 17 + b"tail"
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    want = digest_file(src)
    for name, digest in (("kernel.bin", None), ("hashed.bin", want)):
        seen: list[int] = []
        assert commit.copy_verified(src, tmp_path / name, digest, seen.append, base=5) == len(data)
        assert (tmp_path / name).read_bytes() == data and seen[-1] == 5 + len(data) and len(seen) >= 2
    with pytest.raises(InvalidCheckpoint, match="digest mismatch"):
        commit.copy_verified(src, tmp_path / "bad.bin", want[::-1])
