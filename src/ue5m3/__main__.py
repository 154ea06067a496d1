"""``python -m ue5m3``: the command line."""

import sys

from ue5m3.cli import main

sys.exit(main())
