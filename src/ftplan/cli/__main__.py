"""``python -m ftplan.cli ...`` = ``ftplan ...``."""

import sys

from . import main

sys.exit(main())
