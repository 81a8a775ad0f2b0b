"""``python -m actors.export``: the export child process (see :mod:`actors.export.exporter`)."""

import sys

from actors.export.exporter import main

sys.exit(main())
