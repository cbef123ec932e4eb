"""The benchmark's tests import its package ``bench`` as `make bench` does: from the
folder hack/bench. Not from hack/, where the folder hack/tpusim would shadow the
installed tpusim as an empty namespace package."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
