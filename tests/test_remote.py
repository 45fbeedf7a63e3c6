"""The fleet's store (issue 30): a real ``redis-server`` the tests start on a free port in
a temporary directory, entries signed with Ed25519, the real compilers.

Hostile stores are real peers too: a socket that answers garbage, stalls, or hangs up
mid-reply (a misbehaving server cannot be asked of redis-server)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import entries
import pytest

import xpu_zebin
from xpu_zebin import remote, samples

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server of its own, on a free port, in a temporary directory."""

    def __init__(self, directory: Path, *extra: str, tls: Optional[Path] = None) -> None:
        server = shutil.which("redis-server")
        if server is None:
            pytest.fail("redis-server not found: scripts/prereqs.sh installs it")
        directory.mkdir(parents=True, exist_ok=True)
        self.port, self.tls = _free_port(), tls
        ports = ["--port", str(self.port)]
        if tls is not None:  # TLS only: the plain port is off
            cert, key = str(tls / "cert.pem"), str(tls / "key.pem")
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert,
                     "--tls-key-file", key, "--tls-ca-cert-file", cert,
                     "--tls-auth-clients", "no"]  # fmt: skip
        self.proc = subprocess.Popen(
            [server, *ports, "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(directory), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        import redis

        deadline = time.monotonic() + 60
        while True:
            try:
                self.client(socket_timeout=2).ping()
                break
            except (redis.exceptions.AuthenticationError, redis.exceptions.ResponseError):
                break  # it answers: only not to us
            except redis.exceptions.ConnectionError:
                assert self.proc.poll() is None, "redis-server ended"
                assert time.monotonic() < deadline, "redis-server did not answer in 60 s"
                time.sleep(0.05)

    def url(self, user: str = "", password: str = "") -> str:
        auth = f"{user}:{password}@" if password else ""
        if self.tls is not None:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls / 'cert.pem'}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **kw):
        import redis

        kw.setdefault("socket_timeout", 5)
        if self.tls is not None:
            kw.update(ssl=True, ssl_ca_certs=str(self.tls / "cert.pem"))
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


@pytest.fixture
def server(tmp_path):
    s = RedisServer(tmp_path / "redis")
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def fresh_remote_state(monkeypatch):
    for name in (remote.REMOTE_ENV, remote.MODE_ENV, "XPU_ZEBIN_SIGNING_KEY",
                 "XPU_ZEBIN_TRUSTED_KEYS", remote.MAX_BYTES_ENV):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    remote.reset()
    yield


@pytest.fixture
def keys(tmp_path) -> dict:
    farm = tmp_path / "farm.key"
    other = tmp_path / "other.key"
    return {
        "farm": farm, "farm_public": xpu_zebin._core.key_generate(str(farm), "farm"),
        "other": other, "other_public": xpu_zebin._core.key_generate(str(other), "other"),
    }  # fmt: skip


def _node(monkeypatch, tmp_path, name: str, url: str, mode: str = "read-only", key=None,
          trusted: str = "") -> None:  # fmt: skip
    """This process becomes a fleet node: its own local cache, the store, its keys."""
    monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / f"cache-{name}"))
    monkeypatch.setenv(remote.REMOTE_ENV, url)
    monkeypatch.setenv(remote.MODE_ENV, mode)
    if key is not None:
        monkeypatch.setenv("XPU_ZEBIN_SIGNING_KEY", str(key))
    else:
        monkeypatch.delenv("XPU_ZEBIN_SIGNING_KEY", raising=False)
    if trusted:
        monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", trusted)
    else:
        monkeypatch.delenv("XPU_ZEBIN_TRUSTED_KEYS", raising=False)
    remote.reset()


@pytest.fixture(scope="module")
def spirvs(system_ocloc) -> dict:
    return {
        "add": xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=system_ocloc),
        "spill": xpu_zebin.opencl_to_spirv(
            samples.register_pressure_kernel(300, name="spill"), device="pvc", ocloc=system_ocloc
        ),
    }


def _publish(monkeypatch, tmp_path, server, keys, spirv, ocloc) -> xpu_zebin.CompileResult:
    _node(monkeypatch, tmp_path, "a", server.url(), "read-write", keys["farm"])
    built = xpu_zebin.compile(spirv, device="pvc", ocloc=ocloc)
    assert built.source == "compiled" and remote.counts().get("published") == 1
    return built


def test_a_fleet_shares_signed_native_code(server, keys, spirvs, system_ocloc, tmp_path,
                                           monkeypatch):  # fmt: skip
    built = _publish(monkeypatch, tmp_path, server, keys, spirvs["spill"], system_ocloc)
    assert built.recovered is False and len(built.attempts) == 2
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    got = xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc)
    assert got.source == "remote" and got.binary == built.binary
    assert got.build_flags == built.build_flags and got.n_regs == built.n_regs
    assert [a.build_flags for a in got.attempts] == [a.build_flags for a in built.attempts]
    assert remote.counts() == {"hits": 1}
    # Written back to the local level: the next answer is the node's own cache.
    again = xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc)
    assert again.source == "cache" and again.binary == built.binary
    # A result pickles with where it came from.
    import pickle

    assert pickle.loads(pickle.dumps(got)).source == "remote"


def _tamper(server, how: str, keys) -> None:
    client = server.client()
    (name,) = client.keys(remote.PREFIX + "*")
    value = client.get(name)
    header, entry = remote.unpack(value)
    if how == "flipped":
        mid = len(value) - len(entry) // 2
        value = value[:mid] + bytes([value[mid] ^ 1]) + value[mid + 1 :]
    elif how == "untrusted_key":
        os.environ["XPU_ZEBIN_SIGNING_KEY"] = str(keys["other"])
        try:
            signer, sig = xpu_zebin._core.sign(remote.signed_message(
                header["key"], header["device"], header["compiler"], entry))  # fmt: skip
        finally:
            del os.environ["XPU_ZEBIN_SIGNING_KEY"]
        value = remote.pack({**header, "signer": signer, "signature": sig}, entry)
    elif how == "truncated":  # as a writer killed mid-write would leave it, were SET not atomic
        value = value[: len(value) // 2]
    elif how == "garbage_header":
        value = remote.MAGIC + b"\xff\xff\xff\x7f" + b"x" * 64
    client.set(name, value)


@pytest.mark.parametrize("how", ["flipped", "untrusted_key", "truncated", "garbage_header"])
def test_tampered_entries_are_never_loaded(server, keys, spirvs, system_ocloc, tmp_path,
                                           monkeypatch, caplog, how):  # fmt: skip
    built = _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    _tamper(server, how, keys)
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    for _ in range(2):
        got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc, cache=True)
        assert got.binary == built.binary  # the same kernel, built here
    assert remote.counts() == {"untrusted": 1}
    said = [r for r in caplog.records if "was not loaded" in r.getMessage()]
    assert len(said) == 1


def test_an_entry_replayed_under_another_key_is_refused(server, keys, spirvs, system_ocloc,
                                                        tmp_path, monkeypatch):  # fmt: skip
    """A valid, signed entry of one kernel put under another kernel's key: its signature
    covers its own key, and it decodes only under its own key."""
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    client = server.client()
    (add_name,) = client.keys(remote.PREFIX + "*")
    options = xpu_zebin.Options(ocloc=system_ocloc)
    spill_key = xpu_zebin._core.cache_slot(spirvs["spill"], "pvc", options).key
    value = client.get(add_name)
    header, entry = remote.unpack(value)
    client.set(remote.PREFIX + spill_key, value)  # as it is
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    got = xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc)
    assert got.source == "compiled" and remote.counts() == {"untrusted": 1}
    # Its header rewritten to the new key: the signature no longer holds.
    client.set(remote.PREFIX + spill_key, remote.pack({**header, "key": spill_key}, entry))
    monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / "cache-c"))
    got = xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc)
    assert got.source == "compiled"


def test_no_trusted_key_means_nothing_is_loaded(server, keys, spirvs, system_ocloc, tmp_path,
                                                monkeypatch, caplog):  # fmt: skip
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    _node(monkeypatch, tmp_path, "b", server.url())  # no XPU_ZEBIN_TRUSTED_KEYS
    assert xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc).source == "compiled"
    assert "nothing from the store can be trusted" in caplog.text
    _node(monkeypatch, tmp_path, "c", server.url(), trusted=keys["other_public"])
    assert xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc).source == "compiled"


def test_a_read_only_node_never_writes(server, keys, spirvs, system_ocloc, tmp_path,
                                       monkeypatch):  # fmt: skip
    _node(monkeypatch, tmp_path, "a", server.url(), "read-only", keys["farm"])
    assert xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc).source == "compiled"
    assert server.client().dbsize() == 0 and "published" not in remote.counts()


def test_acl_users_and_a_store_that_refuses_writes(keys, spirvs, system_ocloc, tmp_path,
                                                   monkeypatch, caplog):  # fmt: skip
    """AUTH with ACL users, as sccache and Inductor use them: a writer, and a reader whose
    writes the server refuses (the node compiles, says so once, and goes on)."""
    acl = tmp_path / "users.acl"
    acl.write_text("user default off\nuser farm on >farm-pw ~xpu-zebin:* +@all\n"
                   "user reader on >read-pw ~xpu-zebin:* +@read -@write\n")  # fmt: skip
    server = RedisServer(tmp_path / "redis-acl", "--aclfile", str(acl))
    try:
        _node(monkeypatch, tmp_path, "a", server.url("farm", "farm-pw"), "read-write",
              keys["farm"])  # fmt: skip
        xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
        assert remote.counts() == {"published": 1}
        _node(monkeypatch, tmp_path, "b", server.url("reader", "read-pw"), "read-write",
              keys["farm"], keys["farm_public"])  # fmt: skip
        got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
        assert got.source == "remote"
        spilled = xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc)
        assert spilled.source == "compiled" and remote.counts().get("errors") == 1
        assert "unusable" in caplog.text and "read-pw" not in caplog.text
        wrong = server.url("reader", "wrong")
        _node(monkeypatch, tmp_path, "c", wrong, trusted=keys["farm_public"])
        got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
        assert got.source == "compiled"
    finally:
        server.stop()


def test_a_value_over_the_bound_is_never_read(server, keys, spirvs, system_ocloc, tmp_path,
                                              monkeypatch):  # fmt: skip
    """A value larger than XPU_ZEBIN_REMOTE_MAX_BYTES is never read past one byte over it."""
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    client = server.client()
    (name,) = client.keys(remote.PREFIX + "*")
    client.setrange(name, 64 << 20, b"x")  # a 64 MiB value
    monkeypatch.setenv(remote.MAX_BYTES_ENV, str(1 << 20))
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
    assert got.source == "compiled" and remote.counts() == {"too_large": 1}


#: A store that lies in its answer to a read (``GETRANGE`` to one byte past the bound):
#: ``bulk_lie``, a value of 1 GB (more than a range of the bound's size can hold);
#: ``range_lie``, 100,000 items where one value was asked.
LIES = {
    "bulk_lie": b"$1000000000\r\n" + b"x" * 65536,
    "range_lie": b"*100000\r\n" + b"$1\r\nx\r\n" * 1000,
}


class BadPeer:
    """A TCP peer at the store's address that misbehaves: garbage, a stall, a hang-up."""

    def __init__(self, behaviour: str) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.behaviour = behaviour
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(30)
            try:
                if self.behaviour not in LIES:
                    conn.recv(65536)
                if self.behaviour == "garbage":
                    conn.sendall(b"\x00\xffnot RESP at all\r\n" * 100)
                elif self.behaviour == "huge_length":  # a bulk that says 4 GiB, then hangs up
                    conn.sendall(b"$4294967296\r\n" + b"x" * 1024)
                elif self.behaviour == "stall":
                    self.done.wait(30)
                elif self.behaviour == "trickle":  # each byte within the read timeout
                    for b in b":12345678901234567890" * 100:
                        if self.done.wait(0.2):
                            break
                        conn.sendall(bytes([b]))
                elif self.behaviour in LIES:  # more than a read may take
                    while request := conn.recv(65536):
                        for command in re.split(rb"(?:^|\r\n)\*\d+\r\n", request)[1:]:
                            if b"GETRANGE" in command.upper():
                                conn.sendall(LIES[self.behaviour])
                            else:
                                conn.sendall(b"+OK\r\n")
                        if b"GETRANGE" in request.upper():
                            self.done.wait(30)
                            break
            except OSError:
                pass
            finally:
                conn.close()

    def stop(self) -> None:
        self.done.set()
        self.sock.close()


@pytest.mark.parametrize("behaviour", ["garbage", "huge_length", "stall", "nobody", "trickle",
                                       "bulk_lie", "range_lie"])  # fmt: skip
def test_a_broken_store_means_compiling_locally(keys, spirvs, system_ocloc, tmp_path,
                                                monkeypatch, caplog, behaviour):  # fmt: skip
    """Garbage, a lying length, a stall, a closed port: the compile goes on locally with one
    warning; the store is left alone after (no timeout paid per kernel)."""
    peer = BadPeer(behaviour) if behaviour != "nobody" else None
    port = peer.port if peer else _free_port()
    monkeypatch.setenv(remote.TIMEOUT_ENV, "0.3" if behaviour == "trickle" else "1")
    _node(monkeypatch, tmp_path, "b", f"redis://127.0.0.1:{port}/0", "read-write", keys["farm"],
          keys["farm_public"])  # fmt: skip
    try:
        for name in ("add", "spill"):
            got = xpu_zebin.compile(spirvs[name], device="pvc", ocloc=system_ocloc)
            assert got.source == "compiled"
    finally:
        if peer:
            peer.stop()
    assert remote.counts() == {"errors": 1}
    said = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
    assert len(said) == 1
    if behaviour in LIES:  # refused before a byte of it was read
        assert "over the bound" in said[0]
    if behaviour == "trickle":  # the whole reply's deadline, not each byte's
        assert "no whole reply within 3 s" in said[0]


#: A publisher of its own process: replaces one key with each of the given values in turn,
#: as fast as it can, until its stdin closes.
REPLACER = """
import sys, threading, redis
port, key, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
values = [open(p, "rb").read() for p in paths]
client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=30)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
i = 0
while not stop.is_set():
    client.set(key, values[i % len(values)])
    i += 1
"""


def test_a_value_replaced_mid_read_is_read_whole(server, keys, tmp_path, monkeypatch):
    """Two nodes publishing one key at once (two processes replacing it in a loop, with
    values of different sizes) while this node reads it: every read is one value whole
    (one command reads it, at one instant, in one round trip), none is counted untrusted,
    and nothing but one of the two values is ever taken."""
    _node(monkeypatch, tmp_path, "a", server.url(), "read-write", keys["farm"],
          keys["farm_public"])  # fmt: skip
    rkey = remote.NAMESPACES[1] + "replaced"
    datas = [b"small" * 200, b"large" * (1 << 18)]
    paths = []
    for i, data in enumerate(datas):
        assert xpu_zebin._core.remote_publish_signed(rkey, "id", data)
        paths.append(tmp_path / f"value{i}")
        paths[-1].write_bytes(server.client().get(rkey))
    publishers = []
    for step in (1, -1):  # two publishers, each replacing the key with both values in turn
        argv = [sys.executable, "-c", REPLACER, str(server.port), rkey, *map(str, paths[::step])]
        publishers.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    seen = set()
    try:
        for p in publishers:
            assert p.stdout.readline().strip() == b"ready"
        for _ in range(400):
            (got,) = xpu_zebin._core.remote_fetch_signed([rkey], "id")
            assert got in datas, None if got is None else got[:32]
            seen.add(got)
    finally:
        for p in publishers:
            p.stdin.close()
            p.wait(timeout=60)
    assert remote.counts() == {"published": 2}  # nothing refused, missed or failed
    assert len(seen) == 2  # both values were read: the key was replaced while read


def test_the_largest_bound_reads_every_value(server, keys, tmp_path, monkeypatch):
    """XPU_ZEBIN_REMOTE_MAX_BYTES up to 2^64-1 is a bound like any other: values are read
    (Redis takes a range's end as a signed number; the read never asks past it)."""
    _node(monkeypatch, tmp_path, "a", server.url(), "read-write", keys["farm"],
          keys["farm_public"])  # fmt: skip
    rkey = remote.NAMESPACES[1] + "bounded"
    for n, bound in enumerate((2**63 - 1, 2**63, 2**64 - 1), 1):
        monkeypatch.setenv(remote.MAX_BYTES_ENV, str(bound))
        remote.reset()
        assert xpu_zebin._core.remote_publish_signed(rkey, "id", b"value")
        assert xpu_zebin._core.remote_fetch_signed([rkey], "id") == [b"value"]
        assert remote.counts() == {"published": n}, (bound, remote.counts())


def test_a_mixed_fleet_never_shares_native_code(server, keys, spirvs, system_ocloc,
                                                modern_ocloc, tmp_path, monkeypatch):  # fmt: skip
    """Two compiler releases: the key holds the compiler's identity, so a node with the
    other compiler never finds (let alone loads) the first one's build."""
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=modern_ocloc)
    assert got.source == "compiled" and remote.counts() == {"misses": 1}


def test_bad_settings_are_named(monkeypatch, spirvs, system_ocloc):
    for name, value in [(remote.REMOTE_ENV, "http://x"), (remote.MODE_ENV, "write-only"),
                        (remote.TIMEOUT_ENV, "-1"), (remote.MAX_BYTES_ENV, "1k")]:  # fmt: skip
        monkeypatch.setenv(remote.REMOTE_ENV, "redis://127.0.0.1:1/0")
        monkeypatch.setenv(name, value)
        with pytest.raises(xpu_zebin.InvalidArgumentError, match=name):
            xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
        monkeypatch.delenv(name)
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", "farm:nothex")
    monkeypatch.setenv(remote.REMOTE_ENV, "redis://127.0.0.1:1/0")
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="XPU_ZEBIN_TRUSTED_KEYS"):
        xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)


def _cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xpu_zebin.cli", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})  # fmt: skip


def test_cli_keys_and_the_store(server, keys, spirvs, system_ocloc, tmp_path, monkeypatch):
    out = _cli("key", "generate", str(tmp_path / "k.key"), "--name", "ci")
    assert out.returncode == 0 and out.stdout.startswith("ci:") and len(out.stdout.strip()) == 67
    assert (tmp_path / "k.key").stat().st_mode & 0o777 == 0o600
    assert _cli("key", "generate", str(tmp_path / "k.key")).returncode != 0  # never over a key
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    xpu_zebin.compile(spirvs["spill"], device="pvc", ocloc=system_ocloc)  # a second entry
    env = {remote.REMOTE_ENV: server.url(), "XPU_ZEBIN_TRUSTED_KEYS": keys["farm_public"]}
    stats = json.loads(_cli("remote", "stats", "--json", env=env).stdout)
    assert stats["entries"] == 2
    assert _cli("remote", "verify", env=env).returncode == 0
    client = server.client()
    name = sorted(client.keys(remote.PREFIX + "*"))[0]
    value = client.get(name)
    client.set(name, value[:-1] + bytes([value[-1] ^ 1]))
    bad = _cli("remote", "verify", "--json", env=env)
    assert bad.returncode == 1 and len(json.loads(bad.stdout)["bad"]) == 1
    purged = json.loads(_cli("remote", "purge", "--json", env=env).stdout)
    assert purged["purged"] == 1 and client.dbsize() == 1
    assert _cli("remote", "verify", env=env).returncode == 0


@pytest.fixture
def fleet_triton_cache(monkeypatch):
    """Triton's cache manager is this package's for the test (Triton keeps the class it
    loaded in a module global: put back after)."""
    import triton.runtime.cache as cache

    from xpu_zebin.triton import fleet_cache

    monkeypatch.setenv("TRITON_CACHE_MANAGER", "xpu_zebin.triton.fleet_cache:FleetCacheManager")
    fleet_cache.host_identity.cache_clear()
    yield
    setattr(cache, "__cache_cls", cache.FileCacheManager)
    setattr(cache, "__cache_cls_nme", "DEFAULT")
    fleet_cache.host_identity.cache_clear()


def _counting_front_end(monkeypatch) -> list:
    """Count how often Triton's front end runs (its backend's stages are set up)."""
    from triton.backends import backends

    cls = backends["intel"].compiler
    original, calls = cls.add_stages, []

    def add_stages(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "add_stages", add_stages)
    return calls


def test_tritons_own_cache_through_the_signed_store(server, keys, tmp_path, monkeypatch,
                                                    fleet_triton_cache, modern_ocloc):  # fmt: skip
    """Node A compiles a real Triton kernel: its IRs, SPIR-V and metadata go to the store,
    signed. Node B (a fresh Triton cache, read-only, trusting A's key) gets the kernel with
    no front end at all; a tampered file makes B compile it itself; a node with another
    compiler release never sees A's entries."""
    from triton_helpers import ADD_SIG, add_kernel, compile_triton, triton_on_cpu

    from xpu_zebin.triton import fleet_cache

    front_end = _counting_front_end(monkeypatch)
    _node(monkeypatch, tmp_path, "a", server.url(), "read-write", keys["farm"])
    with triton_on_cpu(str(tmp_path / "triton-a")):
        a = compile_triton(add_kernel, ADD_SIG, {"BLOCK": 1024})
    assert len(front_end) == 1 and remote.counts()["published"] >= 3
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    with triton_on_cpu(str(tmp_path / "triton-b")):
        b = compile_triton(add_kernel, ADD_SIG, {"BLOCK": 1024})
    assert len(front_end) == 1, "node B ran Triton's front end"
    assert b.asm["spv"] == a.asm["spv"] and remote.counts().get("hits") == 1  # one group
    # A flipped byte in the stored SPIR-V: node C compiles the kernel itself.
    client = server.client()
    (spv,) = [k for k in client.keys(fleet_cache.PREFIX + "*") if k.endswith(b".spv")]
    value = client.get(spv)
    client.set(spv, value[:-1] + bytes([value[-1] ^ 1]))
    _node(monkeypatch, tmp_path, "c", server.url(), trusted=keys["farm_public"])
    with triton_on_cpu(str(tmp_path / "triton-c")):
        c = compile_triton(add_kernel, ADD_SIG, {"BLOCK": 1024})
    assert len(front_end) == 2 and c.asm["spv"] == a.asm["spv"]
    assert remote.counts().get("untrusted") == 1
    # Another compiler release on node D: other keys, nothing found.
    _node(monkeypatch, tmp_path, "d", server.url(), trusted=keys["farm_public"])
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", modern_ocloc)
    fleet_cache.host_identity.cache_clear()
    with triton_on_cpu(str(tmp_path / "triton-d")):
        compile_triton(add_kernel, ADD_SIG, {"BLOCK": 1024})
    assert len(front_end) == 3 and "hits" not in remote.counts()


def test_signed_bundles(keys, system_ocloc, spirvs, tmp_path, monkeypatch):
    """A farm signs its bundle (XPU_ZEBIN_SIGNING_KEY, or `bundle sign` after); a node that
    trusts keys imports and looks up only bundles one of them signed; any change to the
    manifest after signing breaks it."""
    from xpu_zebin import bundle, targets

    pvc = targets.local()
    out = tmp_path / "b"
    monkeypatch.setenv("XPU_ZEBIN_SIGNING_KEY", str(keys["farm"]))
    bundle.precompile([{"spirv": spirvs["add"], "name": "add"}], [pvc], out, ocloc=system_ocloc)
    monkeypatch.delenv("XPU_ZEBIN_SIGNING_KEY")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["signature"]["signer"] == keys["farm_public"]
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", keys["farm_public"])
    assert bundle.verify(out)["bad"] == []
    assert bundle.import_bundle(out, tmp_path / "into").exists()
    from xpu_zebin.build_options import load_binary_options

    options = load_binary_options("add", "", "pvc")
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(out))
    assert bundle.find("add", spirvs["add"], options, 0) is not None
    # Trusting another key only: a lookup skips the bundle, an import refuses it.
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", keys["other_public"])
    assert bundle.find("add", spirvs["add"], options, 0) is None
    monkeypatch.delenv("XPU_ZEBIN_BUNDLE")
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", keys["other_public"])
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not a trusted key"):
        bundle.import_bundle(out, tmp_path / "into2")
    assert [k for k, _ in bundle.verify(out)["bad"]] == ["signature"]
    # A changed manifest (a build flag rewritten) no longer matches its signature.
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", keys["farm_public"])
    manifest["entries"][0]["build_flags"] = "-cl-intel-256-GRF-per-thread"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="does not match"):
        bundle.import_bundle(out, tmp_path / "into3")
    # `bundle sign` signs it again; unsigned, a trusting node refuses it; untrusting, uses it.
    out2 = tmp_path / "b2"
    bundle.precompile([{"spirv": spirvs["add"], "name": "add"}], [pvc], out2, ocloc=system_ocloc)
    assert "signature" not in json.loads((out2 / "manifest.json").read_text())
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not signed"):
        bundle.import_bundle(out2, tmp_path / "into4")
    signed = _cli("bundle", "sign", str(out2), env={"XPU_ZEBIN_SIGNING_KEY": str(keys["farm"])})
    assert signed.returncode == 0 and keys["farm_public"] in signed.stdout, signed.stderr
    assert bundle.import_bundle(out2, tmp_path / "into5").exists()
    monkeypatch.delenv("XPU_ZEBIN_TRUSTED_KEYS")
    assert bundle.import_bundle(out, tmp_path / "into6").exists()  # no keys trusted: as before


def test_a_batch_takes_what_the_store_holds(server, keys, spirvs, system_ocloc, tmp_path,
                                            monkeypatch):  # fmt: skip
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    _node(monkeypatch, tmp_path, "b", server.url(), "read-write", keys["farm"],
          keys["farm_public"])  # fmt: skip
    done = []
    reqs = [{"spirv": spirvs[n], "device": "pvc", "ocloc": system_ocloc} for n in ("spill", "add")]
    results = xpu_zebin.compile_many(reqs, progress=done.append)
    assert [r.source for r in results] == ["compiled", "remote"] and sorted(done) == [0, 1]
    assert remote.counts() == {"hits": 1, "misses": 1, "published": 1}


def test_where_native_code_came_from(spirvs, system_ocloc, tmp_path, monkeypatch):
    """`source` on every result: the offline engine, Level Zero, the CLI's JSON, a bundle."""
    from xpu_zebin import bundle, targets

    first = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
    again = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
    assert (first.source, again.source) == ("compiled", "cache")
    with xpu_zebin.compile_and_load(spirvs["add"], "add") as k:
        assert k.source == "compiled"
        native = k.native_binary
    with xpu_zebin.compile_and_load(spirvs["add"], "add") as k:
        assert k.source == "cache"
    with xpu_zebin.compile_and_load(native, "add", is_spv=False) as k:
        assert k.source == "native"
    spv = tmp_path / "add.spv"
    spv.write_bytes(spirvs["add"])
    out = _cli("compile", str(spv), "--device", "pvc", "--ocloc", system_ocloc, "--json")
    assert json.loads(out.stdout)["source"] == "cache"
    import xpu_zebin.triton as xt

    bundle.precompile([{"spirv": spirvs["add"], "name": "add"}], [targets.local()],
                      tmp_path / "b", ocloc=system_ocloc)  # fmt: skip
    monkeypatch.setenv("XPU_ZEBIN_BUNDLE", str(tmp_path / "b"))
    module, *_ = xt.load_binary("add", spirvs["add"], 0, "", True, 0)
    with module:
        assert module.source == "bundle"


def test_tls_with_the_servers_certificate(keys, spirvs, system_ocloc, tmp_path, monkeypatch,
                                          caplog):  # fmt: skip
    """rediss://: a store that speaks TLS (a certificate made here with openssl); a node
    that does not trust the certificate compiles locally, one warning."""
    tls = tmp_path / "tls"
    tls.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(tls / "key.pem"), "-out", str(tls / "cert.pem"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    server = RedisServer(tmp_path / "redis-tls", tls=tls)
    try:
        built = _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
        _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
        got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
        assert got.source == "remote" and got.binary == built.binary
        plain_ca = f"rediss://127.0.0.1:{server.port}/0"  # the system's CAs: not this cert
        _node(monkeypatch, tmp_path, "c", plain_ca, trusted=keys["farm_public"])
        got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
        assert got.source == "compiled" and remote.counts() == {"errors": 1}
        assert "unusable" in caplog.text
    finally:
        server.stop()


def test_a_forged_header_never_crashes_a_compile(server, keys, spirvs, system_ocloc, tmp_path,
                                                 monkeypatch):  # fmt: skip
    """Deeply nested JSON, a lone surrogate in a field: refused like any untrusted entry."""
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    client = server.client()
    (name,) = client.keys(remote.PREFIX + "*")
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    for i, raw in enumerate([b"[" * 60000, json.dumps({"key": "\ud800"}).encode().replace(
            b"\\\\", b"\\")]):  # fmt: skip
        client.set(name, remote.MAGIC + struct.pack("<I", len(raw)) + raw + b"entry")
        monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / f"cache-forged-{i}"))
        got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
        assert got.source == "compiled"
    env = {remote.REMOTE_ENV: server.url(), "XPU_ZEBIN_TRUSTED_KEYS": keys["farm_public"]}
    report = json.loads(_cli("remote", "verify", "--json", env=env).stdout)
    assert len(report["bad"]) == 1 and "malformed" in report["bad"][0]["why"]


def test_a_trusted_but_refused_entry_is_not_the_compilers_fault(server, keys, spirvs,
                                                               system_ocloc, tmp_path,
                                                               monkeypatch):  # fmt: skip
    """An entry a trusted farm signed, whose binary the driver refuses (its .ze_info major
    raised), reaches the driver's loader never: tried in a worker, removed, rebuilt fresh
    here (not fetched again); no (compiler, driver) pair is remembered."""
    import re as regex

    from test_refusal_record import _forge
    from triton_helpers import RecordingUtils

    import xpu_zebin.triton as xt
    from xpu_zebin.triton.fallback import compiler_pair

    xpu_zebin._core.forget_compiler_refusals()
    spirv = spirvs["add"]
    options = xt.native_options("add", "", rule=xt.LOAD_BINARY_RULE, device_arch="pvc")
    monkeypatch.setenv("XPU_ZEBIN_OCLOC", system_ocloc)
    _node(monkeypatch, tmp_path, "a", server.url(), "read-write", keys["farm"])
    good = xpu_zebin.compile(spirv, device="pvc", options=options).binary
    forged = regex.sub(rb"(version:[ ]*')1[.]", rb"\g<1>9.", good, count=1)
    (entry,) = list((tmp_path / "cache-a" / "zebin-v3").glob("*/*.zeentry"))
    _forge(entry, forged)
    client = server.client()
    client.flushdb()
    raw = xpu_zebin._core.cache_slot(spirv, "pvc", options).local()
    assert raw is not None and entries.binary_of(raw) == forged
    remote.publish(spirv, "pvc", options)  # the farm signs the forged entry
    _node(monkeypatch, tmp_path, "b", server.url(), trusted=keys["farm_public"])
    utils = xt.install(RecordingUtils(), backend=False)
    try:
        utils.load_binary("add", spirv, 0, "", True, 0)[0].close()
    finally:
        xt.uninstall()
    assert [binary for _, binary, _, _, _ in utils.calls] == [good]
    assert not xpu_zebin._core.compiler_refused(*compiler_pair(xpu_zebin.Options(), 0))
    assert remote.counts() == {"hits": 1}


def test_purge_needs_trusted_keys_and_an_empty_list_is_refused(server, keys, spirvs,
                                                               system_ocloc, tmp_path,
                                                               monkeypatch):  # fmt: skip
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    out = _cli("remote", "purge", env={remote.REMOTE_ENV: server.url(),
                                       "XPU_ZEBIN_TRUSTED_KEYS": ""})  # fmt: skip
    assert out.returncode == 2 and "needs XPU_ZEBIN_TRUSTED_KEYS" in out.stderr
    assert server.client().dbsize() == 1
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", ",")
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="names no key"):
        xpu_zebin._core.trusted_keys_set()


def test_a_farm_never_signs_what_it_did_not_write(keys, spirvs, system_ocloc, tmp_path,
                                                  monkeypatch):  # fmt: skip
    """A bundle directory someone seeded (unsigned entries): the farm's key adds to it only
    after an explicit `bundle sign`; its Triton entries are not imported untrusted."""
    from xpu_zebin import bundle, targets

    out = tmp_path / "seeded"
    bundle.precompile([{"spirv": spirvs["add"], "name": "add"}], [targets.local()], out,
                      ocloc=system_ocloc)  # fmt: skip
    monkeypatch.setenv("XPU_ZEBIN_SIGNING_KEY", str(keys["farm"]))
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="did not sign"):
        bundle.precompile([{"spirv": spirvs["spill"], "name": "spill"}], [targets.local()], out,
                          ocloc=system_ocloc)  # fmt: skip
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", keys["farm_public"])
    ids = [targets.local().id]
    with pytest.raises(xpu_zebin.InvalidArgumentError, match="not signed"):
        xpu_zebin._core.bundle_triton_entries(str(out), ids)


def test_a_full_store_means_compiling_locally(keys, spirvs, system_ocloc, tmp_path, monkeypatch,
                                              caplog):  # fmt: skip
    """A store out of memory (maxmemory, no eviction) refuses writes: the node compiles,
    says so once, and nothing half-written is left."""
    server = RedisServer(tmp_path / "redis-full", "--maxmemory-policy", "noeviction")
    try:
        import redis

        filler = server.client()
        filler.set("filler", b"x" * (4 << 20))
        # The data alone is over the limit, so every write is refused however the server's
        # own buffers come and go (filling up to the limit left room now and then).
        filler.config_set("maxmemory", filler.info("memory")["used_memory"] // 2)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            filler.set("probe", b"x")
        _node(monkeypatch, tmp_path, "a", server.url(), "read-write", keys["farm"])
        got = xpu_zebin.compile(spirvs["add"], device="pvc", ocloc=system_ocloc)
        assert got.source == "compiled" and remote.counts() == {"errors": 1}
        assert "OutOfMemoryError" in caplog.text and server.client().keys(remote.PREFIX + "*") == []
    finally:
        server.stop()


def test_a_survey_reads_a_page_at_once_and_says_each_bad_key(server, keys, spirvs,
                                                             system_ocloc, tmp_path,
                                                             monkeypatch):  # fmt: skip
    """`remote verify` reads each SCAN page's values in one round; a page holding a key of
    another type, an empty value or one over the bound is read key by key, and each bad
    key is said with its reason; `purge` removes those it can compare."""
    _publish(monkeypatch, tmp_path, server, keys, spirvs["add"], system_ocloc)
    client = server.client()
    (good,) = client.keys(remote.PREFIX + "*")
    client.rpush(remote.PREFIX + "a-list", b"x")
    client.set(remote.PREFIX + "empty", b"")
    client.set(remote.PREFIX + "huge", b"x" * (4 << 20))
    assert client.strlen(good) < 1 << 20
    env = {remote.REMOTE_ENV: server.url(), "XPU_ZEBIN_TRUSTED_KEYS": keys["farm_public"],
           remote.MAX_BYTES_ENV: str(1 << 20)}  # fmt: skip
    stats = json.loads(_cli("remote", "stats", "--json", env=env).stdout)
    assert stats["entries"] == 4
    out = _cli("remote", "verify", "--json", env=env)
    why = {b["key"]: b["why"] for b in json.loads(out.stdout)["bad"]}
    assert out.returncode == 1 and why == {
        remote.PREFIX + "a-list": "not a string value",
        remote.PREFIX + "empty": "malformed (an empty value)",
        remote.PREFIX + "huge": "larger than the bound",
    }, why
    # Under the default bound the huge value is read with the others, and is no entry.
    del env[remote.MAX_BYTES_ENV]
    out = _cli("remote", "verify", "--json", env=env)
    assert remote.PREFIX + "huge" in {b["key"] for b in json.loads(out.stdout)["bad"]}
    # The list and the huge value go; an empty value cannot be compared, and stays.
    purged = json.loads(_cli("remote", "purge", "--json", env=env).stdout)
    assert purged["purged"] == 2
    assert sorted(client.keys()) == sorted([good, (remote.PREFIX + "empty").encode()])
