"""`resilient-run doctor`: real supervisors, real kill -9 and exceptions, real torch jobs (tiny)."""

from __future__ import annotations

import json

from tests.conftest import JOBS, REPO
from tests.supervisor.helpers import run_cli
from tests.support import invoke_cli

DOCTOR_JOB = str(JOBS / "doctor_job.py")
WORD_LM = str(JOBS / "word_lm_job.py")


def test_readme_example_is_exact(tmp_path):
    r = run_cli("doctor", "--steps", "24", "--kill-at", "7,16", "--json", "--keep", str(tmp_path),
                str(REPO / "examples" / "train.py"), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["exact"] is True and out["divergence"] is None and out["exit_code"] == 0
    assert out["steps"] == 24 and out["kill_at"] == [7, 16] and out["interruptions"] == 2
    assert out["baseline_seconds"] > 0 and out["interrupted_seconds"] > 0
    # Side by side (no GPU here): the wall time covers the longer run, not the sum of both.
    assert max(out["baseline_seconds"], out["interrupted_seconds"]) <= out["seconds"] < (
        out["baseline_seconds"] + out["interrupted_seconds"])
    # The faults really happened: a kill -9 and an exception, each once, then a restart.
    (scratch,) = tmp_path.glob("resilient-doctor-*")
    ended = [json.loads(line) for line in (scratch / "interrupted" / "events.jsonl").read_text().splitlines()
             if '"attempt_ended"' in line]
    assert [e["kind"] for e in ended] == ["signal", "crash", "success"]
    assert not (tmp_path / "runs").exists()  # never the user's run dir


def test_batchnorm_changed_after_step_is_named(tmp_path):
    r = run_cli("doctor", "--steps", "12", "--kill-at", "7", DOCTOR_JOB, "bn", cwd=tmp_path, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == ("not exact: BatchNorm buffers of `model` changed after run.step() at step 10: "
                        "state changed outside the checkpointed step")
    assert lines[1].startswith("fix: call run.step() after the last change to training state")


def test_forgotten_numpy_generator_is_named(tmp_path):
    r = run_cli("doctor", "--steps", "12", "--kill-at", "7", "--json", "--sequential", DOCTOR_JOB, "rng", cwd=tmp_path,
                timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    d = json.loads(r.stdout)["divergence"]
    # Killed at 7, resumed from the step-5 checkpoint: step 6 is the first step that differs.
    assert d["step"] == 6
    assert d["component"] == "uncaptured.numpy Generator `noise_rng` (created in doctor_job.py)"
    assert "extra" in d["fix"]


def test_generator_held_by_a_model_module_is_named(tmp_path):
    """Beyond the script's globals: a generator an nn.Module of the model holds (found one level deep in
    the model's modules; the model's own RNG-free modules and the captured global RNGs are not named)."""
    r = run_cli("doctor", "--steps", "8", "--kill-at", "7", "--json", DOCTOR_JOB, "modrng", cwd=tmp_path, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    d = json.loads(r.stdout)["divergence"]
    assert d["step"] == 6
    assert d["component"] == "uncaptured.torch.Generator `model.0.gen` (held by the model)"


def test_generator_local_to_the_training_function_is_named(tmp_path):
    """A loop inside a function (a script's main()): its locals are scanned too (the script's frames only)."""
    r = run_cli("doctor", "--steps", "8", "--kill-at", "7", "--json", DOCTOR_JOB, "localrng", cwd=tmp_path,
                timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    d = json.loads(r.stdout)["divergence"]
    assert d["step"] == 6 and d["component"] == "uncaptured.numpy Generator `local_rng` (created in doctor_job.py)"


def test_word_language_model_with_its_hidden_state_in_run_state_is_exact(tmp_path):
    """pytorch/examples word_language_model's loop: the LSTM state carried across bptt pieces is kept
    in run.state, so the resume in mid-epoch (kill -9 at 7, back from the step-5 save) continues it."""
    r = run_cli("doctor", "--steps", "8", "--kill-at", "7", "--json", WORD_LM, "declared", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["exact"] is True


def test_word_language_model_forgotten_hidden_state_is_outside_the_shims_view(tmp_path):
    """The same loop as written upstream (hidden = init_hidden() per epoch): after the resume at step 5
    the carried state restarts at zeros; every captured component matches, the loss does not."""
    r = run_cli("doctor", "--steps", "8", "--kill-at", "7", WORD_LM, "forgotten", cwd=tmp_path, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == ("not exact: a value outside the shim's view: the loss differs at step 6 while every "
                        "captured component matched")
    assert lines[1] == ("fix: keep every value the loop carries across steps (e.g. an RNN's hidden state) in "
                        "run.state or `extra`, so that checkpoints hold it")


def test_bad_kill_at_is_a_one_line_usage_error(tmp_path):
    r = invoke_cli("doctor", "--kill-at", "x", DOCTOR_JOB, "exact", cwd=tmp_path)  # refused before any run
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("resilient-run: error: --kill-at 'x' is not a list of positive steps; "
                                "use e.g. --kill-at 17,41")


def test_doctor_writes_nothing_into_the_jobs_output_dir(tmp_path):
    """A job that writes into its --output_dir before any Trainer (ms-swift's args.json): doctor's runs
    get a private one each, the user's is never created."""
    user_out = tmp_path / "user-output"
    r = run_cli("doctor", "--steps", "10", "--kill-at", "6", "--json", "--keep", str(tmp_path / "keep"),
                DOCTOR_JOB, "exact", "--output_dir", str(user_out), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["exact"] is True
    assert not user_out.exists(), sorted(p.name for p in user_out.iterdir())
    (scratch,) = (tmp_path / "keep").glob("resilient-doctor-*")
    assert (scratch / "baseline-output" / "args.json").is_file() and (scratch / "interrupted-output").is_dir()


def test_output_dir_flags_in_every_spelling_are_made_private(tmp_path):
    from supervisor.insight.doctor import private_output_dirs

    job = ["--", "swift", "sft", "--output_dir", "out", "--output-dir=o2", "--model", "m", "--output_dir_x", "k"]
    assert private_output_dirs(job, tmp_path) == [
        "--", "swift", "sft", "--output_dir", str(tmp_path), f"--output-dir={tmp_path}", "--model", "m",
        "--output_dir_x", "k"]
