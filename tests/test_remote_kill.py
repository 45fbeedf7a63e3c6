"""A node killed while it writes to the fleet's store (issue 30): a real ``redis-server``,
a real node process killed with SIGKILL in the middle of its SET, and a real proxy between
them that holds the rest of the command back, so the kill lands mid-write every run (no
sleep decides it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
from test_remote import RedisServer, _node, fresh_remote_state, keys, spirvs  # noqa: F401

import xpu_zebin
from xpu_zebin import remote

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


MARKER = b"\r\nSET\r\n"  # a SET command's name, as RESP sends it


class HoldingProxy:
    """Forwards a node's bytes to Redis until its first SET is under way, then forwards
    only part of that command and holds the rest back (``held`` is set)."""

    def __init__(self, upstream_port: int, keep: int = 512) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(600)  # accept() never waits past the test's own deadlines
        self.port = self.sock.getsockname()[1]
        self.upstream_port, self.keep = upstream_port, keep
        self.held = threading.Event()
        self.withheld = 0  # bytes of the SET that never reached Redis
        self.closed = threading.Event()  # the node's connection ended, upstream closed
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:  # stopped, or nobody came: the test says why
            self.closed.set()
            return
        up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=60)
        threading.Thread(target=self._back, args=(up, conn), daemon=True).start()
        pending, tail, sent_of_set = b"", b"", None
        try:
            while chunk := conn.recv(65536):
                if self.held.is_set():
                    self.withheld += len(chunk)  # the rest of the SET: never forwarded
                    continue
                pending += chunk
                if sent_of_set is None:
                    # The marker may start in bytes already forwarded (a split read).
                    at = (tail + pending).find(MARKER) - len(tail)
                    if at < -len(tail):
                        up.sendall(pending)
                        tail, pending = (tail + pending)[-len(MARKER) :], b""
                        continue
                    up.sendall(pending[: max(at, 0)])
                    pending, sent_of_set = pending[max(at, 0) :], max(-at, 0)
                room = self.keep - sent_of_set  # the command's start, part of its value
                up.sendall(pending[:room])
                sent_of_set += min(room, len(pending))
                if len(pending) > room:
                    self.withheld += len(pending) - room
                    self.held.set()
                pending = b""
        except OSError:
            pass
        finally:
            up.close()  # as the node's death closes its connection
            conn.close()
            self.closed.set()

    @staticmethod
    def _back(up: socket.socket, conn: socket.socket) -> None:
        try:
            while chunk := up.recv(65536):
                conn.sendall(chunk)
        except OSError:
            pass

    def stop(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes an accept() still waiting
        except OSError:
            pass
        self.sock.close()


NODE = """
import sys, xpu_zebin
spirv = open(sys.argv[1], "rb").read()
xpu_zebin.compile(spirv, device="pvc", ocloc=sys.argv[2])
"""


def test_a_node_killed_mid_write_leaves_nothing_half_written(keys, spirvs, system_ocloc,  # noqa: F811
                                                             tmp_path, monkeypatch):  # fmt: skip
    """Node A is killed (SIGKILL) with part of its SET sent: the store holds no torn entry,
    node B compiles locally, and a later whole write is taken as usual."""
    server = RedisServer(tmp_path / "redis")
    proxy = HoldingProxy(server.port)
    try:
        spirv_file = tmp_path / "spill.spv"
        spirv_file.write_bytes(spirvs["spill"])
        env = dict(
            os.environ,
            XPU_ZEBIN_CACHE_DIR=str(tmp_path / "cache-a"),
            XPU_ZEBIN_REMOTE=f"redis://127.0.0.1:{proxy.port}/0",
            XPU_ZEBIN_REMOTE_MODE="read-write",
            XPU_ZEBIN_SIGNING_KEY=str(keys["farm"]),
            XPU_ZEBIN_REMOTE_TIMEOUT="600",
        )  # it waits for the reply until killed
        env.pop("XPU_ZEBIN_TRUSTED_KEYS", None)
        node_a = subprocess.Popen([sys.executable, "-c", NODE, str(spirv_file), system_ocloc],
                                  env=env)  # fmt: skip
        try:
            while not proxy.held.wait(0.5):  # node A's exit, if it ends first, says why
                assert node_a.poll() is None, f"node A ended ({node_a.returncode}) unwritten"
            os.kill(node_a.pid, signal.SIGKILL)
            assert node_a.wait(timeout=60) == -signal.SIGKILL
        finally:
            if node_a.poll() is None:
                node_a.kill()
        assert proxy.closed.wait(60)
        assert proxy.withheld > 0  # the kill came with the SET half sent
        client = server.client()
        client.ping()  # the server took the torn command's end and goes on
        assert client.keys(remote.PREFIX + "*") == []

        _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
        got = xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc)
        assert got.source == "compiled" and remote.counts() == {"misses": 1}

        # A whole write of the same kernel, then a fresh node B takes it.
        _node(monkeypatch, tmp_path, "a2", server.url(), "read-write", keys["farm"])
        assert xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc).source == (
            "compiled"
        )
        _node(monkeypatch, tmp_path, "b2", server.url(), trusted=keys["farm_public"])
        again = xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc)
        assert again.source == "remote" and again.binary == got.binary
    finally:
        proxy.stop()
        server.stop()
