"""inferd.tenancy.key_reload: the keys-file poll applies created and revoked keys by itself, keeps the old
keys through a malformed file (reported once per file), and audits each change by key id only."""
from __future__ import annotations

import asyncio

import msgspec
import pytest

from inferd.config.tenants import AuthConfig
from inferd.tenancy.key_reload import KeyReloader, diff_records
from inferd.tenancy.keys import Authenticator, InvalidApiKey, KeyHasher, KeyStore, create_key, revoke_key
from inferd.tenancy.keys_file import KeyFileError, KeyFileUnchanged, load_records, write_records

WAIT_S = 5.0


class AuditRecorder:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def append(self, actor: str, action: str, **fields) -> int:
        self.records.append({"actor": actor, "action": action, **fields})
        return len(self.records)

    def actions(self) -> list[tuple[str, str | None]]:
        return [(r["action"], r.get("target")) for r in self.records]


@pytest.fixture
def keys_file(tmp_path):
    return tmp_path / "keys.jsonl"


@pytest.fixture
async def polled(keys_file):
    """(authenticator, reloader, audit) with the poll running every 10 ms."""
    store = KeyStore(keys_file, KeyHasher(None))
    audit = AuditRecorder()
    reloader = KeyReloader(lambda: store, interval_s=0.01, audit=audit)
    reloader.start()
    yield Authenticator(AuthConfig(mode="api_key"), store), reloader, audit
    await reloader.close()


async def next_change(reloader: KeyReloader, generation: int) -> int:
    return await asyncio.wait_for(reloader.changed(generation), WAIT_S)


async def until(reloader: KeyReloader, condition) -> None:
    """Wait (bounded) for the poll to apply changes until `condition()` holds."""
    async def wait() -> None:
        seen = reloader.generation
        while not condition():
            seen = await reloader.changed(seen)
    await asyncio.wait_for(wait(), WAIT_S)


async def test_poll_applies_created_then_revoked_key_without_being_asked(keys_file, polled):
    auth, reloader, audit = polled
    seen = reloader.generation
    record, key = await asyncio.to_thread(create_key, keys_file, KeyHasher(None), "acme")
    seen = await next_change(reloader, seen)
    assert auth.authenticate(f"Bearer {key}").tenant == "acme"
    await asyncio.to_thread(revoke_key, keys_file, record.key_id)
    await next_change(reloader, seen)
    with pytest.raises(InvalidApiKey):
        auth.authenticate(f"Bearer {key}")
    assert audit.actions() == [("key.create", record.key_id), ("key.revoke", record.key_id)]
    assert audit.records[0]["after"] == {"tenant": "acme", "scopes": ["inference"], "status": "active"}
    assert reloader.counts == {"success": 2, "error": 0}


async def test_audit_records_never_carry_the_key_or_its_hash(keys_file, polled):
    _, reloader, audit = polled
    seen = reloader.generation
    record, key = await asyncio.to_thread(create_key, keys_file, KeyHasher(None), "acme")
    await next_change(reloader, seen)
    text = repr(audit.records)
    assert key not in text and record.hash not in text and key.split("_", 2)[2] not in text


async def test_malformed_file_keeps_old_keys_and_is_reported_once_until_it_changes(keys_file, polled, caplog):
    auth, reloader, audit = polled
    seen = reloader.generation
    _, key = await asyncio.to_thread(create_key, keys_file, KeyHasher(None), "acme")
    seen = await next_change(reloader, seen)
    good = keys_file.read_bytes()
    keys_file.write_bytes(good + b'{"key_id": "half-writ')          # a hand edit cut short
    seen = await next_change(reloader, seen)
    assert auth.authenticate(f"Bearer {key}").tenant == "acme"     # the old keys stay
    assert reloader.counts["error"] == 1 and audit.records[-1]["action"] == "keys.reload_failed"
    assert "keys.jsonl:2" in audit.records[-1]["detail"]["error"]
    with pytest.raises(KeyFileUnchanged):                          # asking again (SIGHUP) still fails...
        await reloader.reload("SIGHUP")
    assert reloader.counts["error"] == 1                           # ...without counting the same file twice
    assert sum("keys_reload_failed" in r.getMessage() for r in caplog.records) == 1
    keys_file.write_bytes(good)                                    # fixed: back to normal
    _, second = await asyncio.to_thread(create_key, keys_file, KeyHasher(None), "beta")
    await until(reloader, lambda: len(auth.store.records()) == 2)          # acme and beta
    assert auth.authenticate(f"Bearer {second}").tenant == "beta"


async def test_reload_of_an_unchanged_file_does_nothing(keys_file):
    store = KeyStore(keys_file, KeyHasher(None))
    reloader = KeyReloader(lambda: store, audit=AuditRecorder())
    assert await reloader.reload("SIGHUP") is None
    assert reloader.generation == 0


async def test_a_new_malformed_file_raises_key_file_error(keys_file):
    store = KeyStore(keys_file, KeyHasher(None))
    reloader = KeyReloader(lambda: store)
    keys_file.write_text("not json\n")
    with pytest.raises(KeyFileError, match="keys.jsonl:1"):
        await reloader.reload("SIGHUP")
    assert reloader.counts == {"success": 0, "error": 1}


def test_diff_names_added_revoked_removed_and_updated_keys(keys_file):
    hasher = KeyHasher(None)
    a, _ = create_key(keys_file, hasher, "a")
    b, _ = create_key(keys_file, hasher, "b")
    c, _ = create_key(keys_file, hasher, "c")
    old = {r.key_id: r for r in load_records(keys_file)}
    revoke_key(keys_file, a.key_id)
    d, _ = create_key(keys_file, hasher, "d")
    records = [r for r in load_records(keys_file) if r.key_id != b.key_id]
    write_records(keys_file, [msgspec.structs.replace(r, scopes=("inference", "admin")) if r.key_id == c.key_id
                              else r for r in records])
    changes = diff_records(old, {r.key_id: r for r in load_records(keys_file)})
    assert changes.summary() == {"added": [d.key_id], "revoked": [a.key_id], "removed": [b.key_id],
                                 "updated": [c.key_id]}


def test_poll_reads_a_file_rewritten_in_place_only_once_its_stamp_holds(keys_file):
    hasher = KeyHasher(None)
    _, key = create_key(keys_file, hasher, "acme")
    store = KeyStore(keys_file, hasher)
    auth = Authenticator(AuthConfig(mode="api_key"), store)
    full = keys_file.read_bytes()
    with open(keys_file, "r+b") as fh:       # a shell redirect caught between truncate and write
        fh.truncate(0)
    assert store.reread(settle=True) is None
    assert auth.authenticate(f"Bearer {key}").tenant == "acme"
    with open(keys_file, "r+b") as fh:       # the write lands before the next poll
        fh.write(full)
    assert store.reread(settle=True) is None      # changed again: wait one more poll
    assert store.reread(settle=True) is not None  # stable: read
    assert auth.authenticate(f"Bearer {key}").tenant == "acme"


def test_a_file_replaced_by_rename_is_read_at_the_first_poll(keys_file):
    hasher = KeyHasher(None)
    create_key(keys_file, hasher, "acme")
    store = KeyStore(keys_file, hasher)
    create_key(keys_file, hasher, "beta")           # temp file + rename: a new inode
    old, new = store.reread(settle=True)
    assert [r.tenant for r in old.values()] == ["acme"] and [r.tenant for r in new.values()] == ["acme", "beta"]
