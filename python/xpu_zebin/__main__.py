import sys

from xpu_zebin.cli import main

sys.exit(main())
