"""``python -m symgrad``: the same as the ``symgrad`` command."""

import sys

from .cli import main

sys.exit(main())
