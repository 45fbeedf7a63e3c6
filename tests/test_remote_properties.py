"""Properties of what a fleet's store hands a node (issue 30), over arbitrary bytes: a
stored value, its header, a signer, a signature, a key list, an entry to adopt. Each is
refused with a ``ValueError`` or a classified ``BuildError``, never a crash, and nothing
unsigned is ever taken. Derandomized, a fixed budget: CI time stays bounded."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpu_zebin
from xpu_zebin import remote, samples

PROPERTY = settings(
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

texts = st.text(max_size=80)


@pytest.fixture(scope="module")
def add(system_ocloc) -> bytes:
    return xpu_zebin.opencl_to_spirv(samples.ADD_KERNEL, device="pvc", ocloc=system_ocloc)


@pytest.fixture(scope="module")
def signed(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("keys")
    public = xpu_zebin._core.key_generate(str(d / "k"), "farm")
    return {"path": d / "k", "public": public}


@PROPERTY
@given(st.binary(max_size=512))
def test_any_value_is_unpacked_or_refused(value):
    try:
        header, entry = remote.unpack(value)
    except ValueError:
        return
    assert all(isinstance(header[f], str) for f in ("key", "device", "compiler", "signer"))
    assert isinstance(entry, bytes)


@PROPERTY
@given(texts, texts, texts, texts, texts, st.binary(max_size=256))
def test_any_header_is_checked_without_a_crash(key, device, compiler, signer, sig, entry):
    raw = json.dumps({"key": key, "device": device, "compiler": compiler, "signer": signer,
                      "signature": sig}).encode()  # fmt: skip
    value = remote.MAGIC + struct.pack("<I", len(raw)) + raw + entry
    assert remote.check(remote.PREFIX.encode() + key.encode(errors="replace"), value) is not None


@PROPERTY
@given(signer=texts, message=st.binary(max_size=128), signature=texts)
def test_verify_takes_any_input(signed, monkeypatch, signer, message, signature):
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", signed["public"])
    assert xpu_zebin._core.verify(signer, message, signature) is False


@PROPERTY
@given(text=st.text(alphabet=st.characters(blacklist_characters="\0", codec="utf-8"), max_size=200))
def test_any_trusted_key_list_parses_or_is_named(monkeypatch, text):
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", text)
    try:
        xpu_zebin._core.trusted_keys_set()
    except xpu_zebin.InvalidArgumentError as e:
        assert "XPU_ZEBIN_TRUSTED_KEYS" in str(e)


@PROPERTY
@given(entry=st.binary(max_size=2048))
def test_any_entry_is_adopted_only_when_it_is_one(add, system_ocloc, entry):
    """A forged entry (any bytes) never reaches the local cache: a BuildError."""
    options = xpu_zebin.Options(ocloc=system_ocloc)
    with pytest.raises(xpu_zebin.BuildError):
        xpu_zebin._core.cache_slot(add, "pvc", options).adopt(entry)


def test_a_real_entry_with_any_one_byte_changed_is_refused(add, system_ocloc, signed, tmp_path,
                                                           monkeypatch):  # fmt: skip
    """Every single-byte change of a real signed value fails: the signature or the
    checksum under the node's own key."""
    monkeypatch.setenv("XPU_ZEBIN_CACHE_DIR", str(tmp_path / "c"))
    options = xpu_zebin.Options(ocloc=system_ocloc)
    xpu_zebin.compile(add, device="pvc", options=options)
    slot = xpu_zebin._core.cache_slot(add, "pvc", options)
    key, entry, compiler = slot.key, slot.local(), slot.compiler
    monkeypatch.setenv("XPU_ZEBIN_SIGNING_KEY", str(signed["path"]))
    signer, sig = xpu_zebin._core.sign(remote.signed_message(key, "pvc", compiler, entry))
    value = remote.pack({"key": key, "device": "pvc", "compiler": compiler, "signer": signer,
                         "signature": sig}, entry)  # fmt: skip
    monkeypatch.setenv("XPU_ZEBIN_TRUSTED_KEYS", signed["public"])
    name = (remote.PREFIX + key).encode()
    assert remote.check(name, value) is None
    step = max(1, len(value) // 400)
    for i in range(0, len(value), step):
        changed = value[:i] + bytes([value[i] ^ 0x20]) + value[i + 1 :]
        assert remote.check(name, changed) is not None, i
