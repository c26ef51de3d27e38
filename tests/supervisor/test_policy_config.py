"""The `policy:` section: parsing, one-line errors, the template language, per-kind budgets."""

from __future__ import annotations

import pytest

from supervisor.decisions.classify import Kind
from supervisor.config import build_config, load_config_file
from supervisor.errors import ConfigError
from supervisor.decisions.failure_policy import apply_rule, parse_policy
from supervisor.decisions.smart_restarts import SmartRestarts

from tests.support import invoke_cli

from .helpers import FAKE_JOB


def _cfg(tmp_path, text: str, *args: str):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return build_config(load_config_file(p), {"script": FAKE_JOB, "args": list(args)})


@pytest.mark.parametrize("text, message", [
    ("policy:\n  omm: {}\n", "policy: unknown failure kind 'omm' (did you mean 'oom'?)"),
    ("policy:\n  oom: {evn: {A: b}}\n", "policy.oom: unknown key 'evn' (did you mean 'env'?)"),
    ("policy:\n  oom: {max_restarts: -1}\n", "policy.oom.max_restarts: expected a whole number >= 0"),
    ("policy:\n  oom: {args: ['{__import__(\"os\")}']}\n", "is not `{name}` or `{name OP NUMBER}`"),
    ("policy:\n  oom: {args: ['{batch_size / 2}']}\n", "names --batch-size, which the job's argv does not have"),
    ("policy: [oom]\n", "policy: expected a mapping"),
])
def test_bad_policy_is_one_line_error(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_policy_from_the_cli_exits_2_with_one_line(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text("policy:\n  cuda_om: {max_restarts: 1}\n")
    r = invoke_cli("--run-dir", str(tmp_path / "run"), "--config", str(p), FAKE_JOB)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown failure kind 'cuda_om' (did you mean 'cuda_oom'?)" in lines[0]
    assert not (tmp_path / "run").exists()


def test_templates_halve_in_place_and_accumulate():
    (rule,) = parse_policy({"cuda_oom": {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                                         "args": ["--batch-size", "{batch_size / 2}", "--grad-accum={grad_accum * 2}",
                                                  "--low-mem"]}})
    argv = ("python", "train.py", "--batch-size", "8", "--grad-accum=1")
    sizes = []
    for _ in range(4):
        argv, env, _ = apply_rule(rule, argv, {})
        sizes.append((argv[3], argv[4]))
    assert sizes == [("4", "--grad-accum=2"), ("2", "--grad-accum=4"), ("1", "--grad-accum=8"), ("1", "--grad-accum=16")]
    assert argv.count("--low-mem") == 1 and env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    (lr,) = parse_policy({"crash": {"args": ["--lr", "{lr * 0.5}", "--seed", "{seed + 1}"]}})
    out, _, rendered = apply_rule(lr, ("t.py", "--lr", "0.1", "--seed", "3"), {})
    assert rendered == ["--lr", "0.05", "--seed", "4"] and out == ("t.py", "--lr", "0.05", "--seed", "4")


def test_per_kind_budget_and_actions(tmp_path):
    cfg = _cfg(tmp_path, "policy:\n  oom: {max_restarts: 1, env: {X: '1'}, args: [--batch-size, '{batch_size // 2}']}\n",
               "--batch-size", "6")
    smart = SmartRestarts(cfg)
    j = smart.judge(Kind.OOM, failures_of_kind=1, diverged_step=None, resumed_from=None, resumed_step=None, newer=())
    assert j.give_up is None
    fields = smart.apply(Kind.OOM)
    assert fields is not None and fields["args"] == ["--batch-size", "3"] and smart.command[-2:] == ("--batch-size", "3")
    assert smart.attempt_env({"A": "a"}) == {"A": "a", "X": "1"}
    j = smart.judge(Kind.OOM, failures_of_kind=2, diverged_step=None, resumed_from=None, resumed_step=None, newer=())
    assert j.give_up == "restarts after oom exhausted (1 of policy.oom.max_restarts)"
    assert smart.apply(Kind.CRASH) is None   # no rule for crash: nothing changes
