"""The nemesis run: the whole system as separate nodes, hurt at random from a seeded schedule.

See docs/faults.md, "Nemesis". ``python -m tests.nemesis --seed S --minutes M``.
The private servers and process spawning come from ``tests/faults/faultkit.py``.
"""

import sys
from pathlib import Path

_FAULTS = str(Path(__file__).resolve().parent.parent / "faults")
if _FAULTS not in sys.path:  # faultkit is imported as a top-level module, as tests/faults does
    sys.path.insert(0, _FAULTS)
