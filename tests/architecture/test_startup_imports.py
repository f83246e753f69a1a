"""What a job's start loads: the supervisor and `import meshsched.job` leave the wire protocol (msgpack) and
torch out, so that neither delays a rank's start (every queued job inherits that delay)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _loaded(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nimport json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("statement", ["import meshsched.daemon.supervisor", "from meshsched import job"])
def test_start_up_leaves_the_wire_protocol_and_torch_out(statement):
    loaded = _loaded(statement)
    assert not loaded & {"meshsched.wire.protocol", "msgpack", "torch", "numpy"}


def test_the_exit_code_is_one_value_everywhere():
    from meshsched.daemon import supervisor

    from meshsched import job
    from meshsched.wire.exitcodes import PREEMPTED_EXIT_CODE

    assert job.PREEMPTED_EXIT_CODE == supervisor.PREEMPTED_EXIT_CODE == PREEMPTED_EXIT_CODE == 75
