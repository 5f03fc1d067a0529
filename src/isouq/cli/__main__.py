"""``python -m isouq.cli`` (the same as ``python -m isouq`` and the ``isouq`` command)."""

import sys

from . import main

sys.exit(main())
