"""Generated copies must match their source (`make sync-crds` regenerates them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_crd_copies_match_crds_dir() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "sync_crds.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
