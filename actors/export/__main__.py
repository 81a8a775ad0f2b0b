"""``python -m actors.export``: the export child process (see the package docstring)."""

import sys

from actors.export import main

sys.exit(main())
