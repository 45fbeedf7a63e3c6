"""``python -m xpu_zebin.cli``, as ``python -m xpu_zebin``."""

import sys

from . import main

sys.exit(main())
