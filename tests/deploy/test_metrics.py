"""The textfile parses as Prometheus reads it, and readers never see a torn file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from supervisor.insight.metrics import FAILURE_KINDS, MetricsSnapshot, disk_free_bytes, render, textfile_name, write_textfile
from trainer_shim.rundir import ensure_run_dir

FULL = MetricsSnapshot(
    run="exp-1", up=True, attempts_total=3, failures_by_kind={"crash": 1, "hang": 1},
    heartbeat_age_s=1.25, global_step=140, last_checkpoint_step=100, last_checkpoint_age_s=42.5,
    disk_free_bytes=123_456_789_012,
)


def parse(text: str) -> dict[str, tuple[str, list]]:
    """family name -> (type, [(sample name, labels, value)])."""
    return {
        f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def test_full_snapshot_names_types_values():
    fams = parse(render(FULL))
    run = {"run": "exp-1"}
    assert fams["resilient_run_up"] == ("gauge", [("resilient_run_up", run, 1.0)])
    # The parser names counter families without their _total suffix.
    assert fams["resilient_run_attempts"] == ("counter", [("resilient_run_attempts_total", run, 3.0)])
    ftype, fsamples = fams["resilient_run_failures"]
    assert ftype == "counter"
    by_kind = {s[1]["kind"]: s[2] for s in fsamples}
    assert all(s[0] == "resilient_run_failures_total" and s[1]["run"] == "exp-1" for s in fsamples)
    assert by_kind == {k: (1.0 if k in ("crash", "hang") else 0.0) for k in FAILURE_KINDS}
    for name, value in [
        ("resilient_run_heartbeat_age_seconds", 1.25), ("resilient_run_global_step", 140),
        ("resilient_run_last_checkpoint_step", 100), ("resilient_run_last_checkpoint_age_seconds", 42.5),
        ("resilient_run_disk_free_bytes", 123_456_789_012),
    ]:
        assert fams[name] == ("gauge", [(name, run, value)])
    text = render(FULL)
    assert text.endswith("\n") and text.count("# HELP ") == text.count("# TYPE ") == len(fams)


def test_none_values_are_omitted_and_down_is_zero():
    s = MetricsSnapshot(run="r", up=False, attempts_total=0, failures_by_kind={}, heartbeat_age_s=None,
                        global_step=None, last_checkpoint_step=None, last_checkpoint_age_s=None, disk_free_bytes=None)
    fams = parse(render(s))
    assert set(fams) == {"resilient_run_up", "resilient_run_attempts", "resilient_run_failures"}
    assert fams["resilient_run_up"][1][0][2] == 0.0
    assert "heartbeat_age" not in render(s)  # not even an empty HELP/TYPE


def test_label_values_are_escaped():
    nasty = 'we"ird\\run\nname'
    s = MetricsSnapshot(run=nasty, up=True, attempts_total=1, failures_by_kind={'k"x': 2}, heartbeat_age_s=None,
                        global_step=None, last_checkpoint_step=None, last_checkpoint_age_s=None, disk_free_bytes=None)
    fams = parse(render(s))
    assert fams["resilient_run_up"][1][0][1] == {"run": nasty}
    assert {"run": nasty, "kind": 'k"x'} in [x[1] for x in fams["resilient_run_failures"][1]]
    assert len(render(s).splitlines()) == render(s).count("\n")  # the newline stayed escaped
    assert textfile_name(nasty) == "resilient_run_we_ird_run_name.prom"


def test_write_textfile_to_run_dir_and_collector_dir(tmp_path: Path):
    rd = ensure_run_dir(tmp_path / "exp-1")
    collector = tmp_path / "textfile"
    collector.mkdir()
    write_textfile(rd, FULL, str(collector))
    assert rd.metrics.read_text() == render(FULL)
    assert (collector / "resilient_run_exp-1.prom").read_text() == render(FULL)
    # Only the final files remain: no temp files for node-exporter to trip over.
    assert os.listdir(collector) == ["resilient_run_exp-1.prom"]
    assert [p.name for p in rd.root.iterdir() if p.is_file()] == ["metrics.prom"]
    write_textfile(rd, FULL)  # no collector dir: run dir only
    assert os.listdir(collector) == ["resilient_run_exp-1.prom"]


def test_concurrent_reader_never_sees_a_torn_file(tmp_path: Path):
    rd = ensure_run_dir(tmp_path / "run")
    snapshots = [
        MetricsSnapshot(run="run", up=bool(i % 2), attempts_total=i, failures_by_kind={"crash": i},
                        heartbeat_age_s=i / 3, global_step=i * 1000 if i % 3 else None,
                        last_checkpoint_step=i, last_checkpoint_age_s=None, disk_free_bytes=disk_free_bytes(tmp_path))
        for i in range(400)
    ]
    valid = {render(s) for s in snapshots}
    write_textfile(rd, snapshots[0])
    done = threading.Event()

    def writer() -> None:
        for s in snapshots:
            write_textfile(rd, s)
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    reads = 0
    while not done.is_set():
        assert rd.metrics.read_text() in valid
        reads += 1
    t.join()
    assert reads > 0 and rd.metrics.read_text() == render(snapshots[-1])


def test_disk_free_bytes():
    assert disk_free_bytes("/") > 0
    assert disk_free_bytes("/nonexistent/path/x") is None
