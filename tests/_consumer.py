"""A consumer program run in a session of its own, for the failure tests of both front ends.

Its own session keeps signals sent to its process group from reaching pytest.
It speaks one JSON object per line on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Seconds any step of a consumer may take before the test fails instead of hanging.
GUARD = 30.0


class Consumer:
    """``python script h5 mode start_method *extra``, with the checkout first on its path."""

    def __init__(self, script: Path, h5: Path, mode: str, start_method: "str | None" = None, *extra: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(h5), mode, start_method or "default", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )

    def read(self) -> dict[str, Any]:
        """The next message; fails (rather than waits for ever) if none comes."""
        got: list[str] = []
        stdout = self.proc.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(GUARD)
        if not got or not got[0]:
            self.proc.kill()
            raise AssertionError(f"no message from the consumer; stderr:\n{self.proc.communicate()[1]}")
        return json.loads(got[0])

    def finish(self) -> tuple[int, str]:
        """Wait for the consumer to exit; its exit code and stderr."""
        try:
            _, err = self.proc.communicate(timeout=GUARD)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"the consumer did not exit; stderr:\n{err}")
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()
