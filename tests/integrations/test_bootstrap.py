"""The auto-attach bootstrap in a process that imports no framework: nothing heavy is loaded, the
user's own sitecustomize still runs, and --no-auto-attach keeps the bootstrap off PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from supervisor.config import build_config
from supervisor.decisions.smart_restarts import SmartRestarts
from tests.conftest import PYTHON, REPO, child_env
from trainer_shim.rundir import ATTACH_DIR, ENV_CALLBACK

_PROBE = """
import json, sys
import sitecustomize
print(json.dumps({"heavy": sorted(m for m in ("torch", "transformers", "lightning", "trainer_shim")
                                  if m in sys.modules),
                  "user": getattr(sitecustomize, "USER_SITE_RAN", False),
                  "finder": any(type(f).__name__ == "type" and f.__name__ == "_Finder" for f in sys.meta_path)}))
"""


def test_bootstrap_is_light_and_chains_the_users_sitecustomize(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("USER_SITE_RAN = True\n")
    env = child_env(PYTHONPATH=os.pathsep.join([str(ATTACH_DIR), str(user), str(REPO)]))
    r = subprocess.run([PYTHON, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # The chained module takes the name: what the user's code imports as `sitecustomize` is theirs.
    assert json.loads(r.stdout) == {"heavy": [], "user": True, "finder": True}, r.stdout


def test_the_supervisor_sets_the_bootstrap_and_options_only_when_on() -> None:
    on = SmartRestarts(build_config({"callback": {"save_every_steps": 5}}, {"script": "train.py"})).base_env()
    assert on["PYTHONPATH"].split(os.pathsep)[0] == str(ATTACH_DIR)
    assert json.loads(on[ENV_CALLBACK]) == {"save_every_steps": 5}
    off = SmartRestarts(build_config({"callback": {"save_every_steps": 5}},
                                     {"script": "train.py", "auto_attach": False})).base_env()
    assert str(ATTACH_DIR) not in off.get("PYTHONPATH", "").split(os.pathsep) and ENV_CALLBACK not in off
