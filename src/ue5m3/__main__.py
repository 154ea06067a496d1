"""``python -m ue5m3``: the command line."""

import sys

from .cli import main

sys.exit(main())
