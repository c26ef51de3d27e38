"""raw_read in-process: bytes read straight into contiguous live tensors,
strided live targets and saved strides honoured, nothing aliases the file, a bad digest names
the tensor and says whether live bytes had changed, the two-reader split gives the same result."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from trainer_shim._restore import raw_read, slot_maps
from trainer_shim._disk import raw_tensors as raw
from trainer_shim import rundir
from trainer_shim.errors import CheckpointError


def _member(tmp_path: Path, tensors: list[torch.Tensor], name: str = "m.pt") -> Path:
    """Write a split member the way a memory snapshot does (region, then its table)."""
    entries = raw.plan(tensors)
    assert entries is not None
    path = tmp_path / (name + rundir.TENSORS_SUFFIX)
    mm = raw.create(path, entries)
    for e, t in zip(entries, tensors):
        raw.view(mm, e).copy_(t)
    table, _whole = raw.digests(mm, entries)
    (tmp_path / (name + rundir.TABLE_SUFFIX)).write_bytes(raw.table_bytes(table))
    mm.close()
    return path


def _states() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(64, 33, generator=g),
            torch.randn(2, 3, 5, 7, generator=g).contiguous(memory_format=torch.channels_last),
            torch.randn(40, 9, generator=g).t(),  # dense but transposed
            torch.randn(17, generator=g).to(torch.bfloat16),
            torch.empty(0, 4),
            torch.arange(12, dtype=torch.int64).view(3, 4)]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_bytes_go_straight_into_live_tensors_and_strided_ones_keep_their_layout(tmp_path: Path) -> None:
    src = _states()
    path = _member(tmp_path, src)
    live = [torch.zeros_like(t) for t in src]  # zeros_like keeps channels_last and the transposed stride
    ptrs, strides = [t.data_ptr() for t in live], [t.stride() for t in live]
    got = raw_read.load(path, dict(enumerate(live)))
    for i, (g, t, s) in enumerate(zip(got, live, src)):
        assert g is t and g.data_ptr() == ptrs[i] and g.stride() == strides[i], i
        assert torch.equal(g, s), i


def test_fresh_tensors_have_the_saved_stride_and_never_alias_the_file(tmp_path: Path) -> None:
    src = _states()
    path = _member(tmp_path, src)
    got = raw_read.load(path)
    for i, (g, s) in enumerate(zip(got, src)):
        assert torch.equal(g, s) and g.dtype == s.dtype, i
        if s.numel():
            assert g.stride() == s.stride(), i
    # A later rewrite of the slot's bytes cannot change what was loaded.
    path.write_bytes(bytes(path.stat().st_size))
    for i, (g, s) in enumerate(zip(got, src)):
        assert torch.equal(g, s), i


def test_a_bad_digest_names_the_tensor_and_says_whether_live_bytes_changed(tmp_path: Path) -> None:
    src = _states()
    path = _member(tmp_path, src)
    entries = raw.read_table(tmp_path / ("m.pt" + rundir.TABLE_SUFFIX))
    _flip(path, entries[3].offset + 1)
    # No live target: nothing the user owns changed, a plain rejection.
    with pytest.raises(CheckpointError, match="tensor 3 digest mismatch") as ei:
        raw_read.load(path)
    assert not isinstance(ei.value, raw_read.LiveStateChanged)
    # A strided live target is staged and copied only after it verifies: still untouched.
    cl = torch.zeros_like(src[1])
    with pytest.raises(CheckpointError) as ei:
        raw_read.load(path, {1: cl})
    assert not isinstance(ei.value, raw_read.LiveStateChanged) and not cl.any()
    # A contiguous live target is read into directly: the caller must know it changed.
    with pytest.raises(raw_read.LiveStateChanged, match="tensor 3"):
        raw_read.load(path, {0: torch.zeros_like(src[0])})


def test_two_readers_split_a_big_member_and_agree(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    src = [torch.randn(3 << 20, generator=g) for _ in range(3)] + [torch.randn(5, generator=g)]  # ~36 MiB
    path = _member(tmp_path, src)
    table = raw.read_table(tmp_path / ("m.pt" + rundir.TABLE_SUFFIX))
    assert raw_read._readers(raw.size_of(table)) == min(2, os.cpu_count() or 1)
    live = [torch.zeros_like(t) for t in src[:2]]
    got = raw_read.load(path, {0: live[0], 1: live[1]})
    assert got[0] is live[0] and got[1] is live[1]
    assert all(torch.equal(a, b) for a, b in zip(got, src))


def test_members_read_in_one_pass_name_the_bad_one_and_report_live_bytes_of_any(tmp_path: Path) -> None:
    """A restore reads model and optimizer together: a bad tensor in the second member still says
    that the first one's live tensors changed, and what ran meanwhile on the caller's thread is returned."""
    g = torch.Generator().manual_seed(2)
    model = [torch.randn(2 << 20, generator=g), torch.randn(7, generator=g)]
    opt = [torch.randn(3 << 20, generator=g), torch.randn(1 << 20, generator=g)]
    mpath, opath = _member(tmp_path, model, "model.pt"), _member(tmp_path, opt, "optimizer.pt")
    live = [torch.zeros_like(t) for t in model]
    (got_model, got_opt), extra = raw_read.read([raw_read.prepare(mpath, dict(enumerate(live))),
                                                 raw_read.prepare(opath)], lambda: "trainer state")
    assert extra == "trainer state" and got_model[0] is live[0]
    assert all(torch.equal(a, b) for a, b in zip(got_model + got_opt, model + opt))
    table = raw.read_table(tmp_path / ("optimizer.pt" + rundir.TABLE_SUFFIX))
    _flip(opath, table[1].offset + 5)
    live = [torch.zeros_like(t) for t in model]
    with pytest.raises(raw_read.LiveStateChanged, match="optimizer.pt.tensors: tensor 1 digest mismatch"):
        raw_read.read([raw_read.prepare(mpath, dict(enumerate(live))), raw_read.prepare(opath)])
    # Without live targets nothing the user owns changed; a failure on the caller's thread ends the
    # read too (the readers joined, the files closed).
    with pytest.raises(CheckpointError, match="tensor 1") as ei:
        raw_read.read([raw_read.prepare(mpath), raw_read.prepare(opath)])
    assert not isinstance(ei.value, raw_read.LiveStateChanged)
    members = [raw_read.prepare(mpath), raw_read.prepare(opath)]

    def fails() -> None:
        raise CheckpointError("trainer.pt: refused")
    with pytest.raises(CheckpointError, match="trainer.pt: refused"):
        raw_read.read(members, fails)
    assert all(m.fd == -1 for m in members)


def test_a_held_mapping_of_the_slot_is_read_only_while_it_is_the_same_file(tmp_path: Path) -> None:
    """The warm standby maps a slot's regions ahead (slot_maps.follow): the restore copies out of
    the mapping while it is the very file it opened; a replaced file is read from itself, and a
    removed one is no longer mapped (its memory not kept alive)."""
    g = torch.Generator().manual_seed(3)
    src = [torch.randn(1 << 20, generator=g), torch.randn(9, generator=g)]
    path = _member(tmp_path, src, rundir.MODEL_FILE)
    try:
        assert slot_maps.follow([tmp_path]) == path.stat().st_size
        before = slot_maps.read_through()
        got = raw_read.load(path)
        assert slot_maps.read_through() - before == sum(t.numel() * t.element_size() for t in src)
        assert all(torch.equal(a, b) for a, b in zip(got, src))
        # Replaced (a new inode of the same size, other values): never read through the old mapping.
        path.unlink()
        new = [t + 1 for t in src]
        _member(tmp_path, new, rundir.MODEL_FILE)
        got = raw_read.load(path)
        assert slot_maps.read_through() - before == sum(t.numel() * t.element_size() for t in src)
        assert all(torch.equal(a, b) for a, b in zip(got, new))
        # Removed: unmapped at the next poll.
        path.unlink()
        assert slot_maps.follow([tmp_path]) == 0 and not slot_maps._maps
        # Held when the restore ends: unmapped right after (on a thread), nothing left in this process.
        _member(tmp_path, src, rundir.MODEL_FILE)
        assert slot_maps.follow([tmp_path]) > 0 and str(path) in Path("/proc/self/maps").read_text()
    finally:
        slot_maps.release()
    deadline = time.monotonic() + 30
    while str(path) in Path("/proc/self/maps").read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert str(path) not in Path("/proc/self/maps").read_text()
