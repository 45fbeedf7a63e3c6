"""A persistent worker process, started by the engine (never by hand):

``python -m xpu_zebin._worker ocloc LIBOCLOC`` loads Intel's libocloc once and compiles;
``python -m xpu_zebin._worker ze`` opens the Level Zero driver and builds SPIR-V modules.
Either serves requests on stdin/stdout until stdin closes; see ``src/pool/``. Anything
that crashes the compiler ends this process, never the caller.
"""

import sys

from xpu_zebin._core import serve_worker

if __name__ == "__main__":
    serve_worker(*sys.argv[1:3])
