"""A persistent compiler worker: ``python -m xpu_zebin._worker LIBOCLOC``.

Started by the engine (never by hand). It loads Intel's libocloc once and serves compile
requests on stdin/stdout until stdin closes; see ``src/worker.rs`` for the protocol.
"""

import sys

from xpu_zebin._core import serve_worker

if __name__ == "__main__":
    serve_worker(sys.argv[1])
