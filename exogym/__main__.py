"""``python -m exogym ...`` == ``exogym ...``."""

import sys

from exogym.cli import main

sys.exit(main())
