"""``python -m tests.nemesis --seed S --minutes M``: see docs/faults.md, "Nemesis"."""

import sys

from .run import main

sys.exit(main())
