"""``python -m bench …``: see bench/run.py."""

import sys

from .run import main

sys.exit(main())
