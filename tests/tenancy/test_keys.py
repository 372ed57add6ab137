import stat

import pytest

from inferd.config.tenants import AuthConfig
from inferd.tenancy.keys import (
    Authenticator,
    InsufficientScope,
    InvalidApiKey,
    KeyFileError,
    KeyHasher,
    KeyStore,
    MissingApiKey,
    create_key,
    load_records,
    parse_key_id,
    revoke_key,
)


@pytest.fixture
def keys_file(tmp_path):
    return tmp_path / "keys.jsonl"


def make_auth(keys_file, secret=b"s" * 32):
    store = KeyStore(keys_file, KeyHasher(secret))
    return Authenticator(AuthConfig(mode="api_key"), store), store


def test_created_key_has_prefix_and_only_its_hash_is_stored(keys_file):
    record, key = create_key(keys_file, KeyHasher(b"s" * 32), "acme")
    assert key.startswith("inf_" + record.key_id + "_") and len(key) > 50
    text = keys_file.read_text()
    assert key not in text and key.split("_", 2)[2] not in text and record.hash in text
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    assert parse_key_id(key) == record.key_id


def test_bearer_key_authenticates_to_its_tenant(keys_file):
    _, key = create_key(keys_file, KeyHasher(b"s" * 32), "acme", ["inference", "metrics"])
    auth, _ = make_auth(keys_file)
    p = auth.authenticate(f"Bearer {key}")
    assert p.tenant == "acme" and p.scopes == {"inference", "metrics"}
    assert auth.authenticate(f"bearer {key}", scope="metrics").tenant == "acme"


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer "])
def test_missing_or_malformed_header_is_401_missing(keys_file, header):
    auth, _ = make_auth(keys_file)
    with pytest.raises(MissingApiKey) as exc:
        auth.authenticate(header)
    assert exc.value.status == 401


def test_wrong_unknown_and_garbage_keys_are_the_same_401(keys_file):
    _, key = create_key(keys_file, KeyHasher(b"s" * 32), "acme")
    auth, store = make_auth(keys_file)
    unknown = "inf_000000000000_" + key.split("_", 2)[2]
    for bad in (key[:-1] + ("A" if key[-1] != "A" else "B"), unknown, "garbage", "inf_zz"):
        with pytest.raises(InvalidApiKey) as exc:
            auth.authenticate(f"Bearer {bad}")
        assert exc.value.status == 401 and str(exc.value) == "invalid API key"


def test_unknown_key_id_still_hashes_and_compares(keys_file, monkeypatch):
    create_key(keys_file, KeyHasher(b"s" * 32), "acme")
    _, store = make_auth(keys_file)
    calls = []
    import inferd.tenancy.keys as keys_mod
    real = keys_mod.hmac.compare_digest
    monkeypatch.setattr(keys_mod.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    assert store.verify("inf_000000000000_" + "x" * 43) is None
    assert store.verify("not-a-key") is None
    assert len(calls) == 2


def test_missing_scope_is_403(keys_file):
    _, key = create_key(keys_file, KeyHasher(b"s" * 32), "acme", ["metrics"])
    auth, _ = make_auth(keys_file)
    with pytest.raises(InsufficientScope) as exc:
        auth.authenticate(f"Bearer {key}")
    assert exc.value.status == 403


def test_revoked_key_stops_working_after_reload(keys_file):
    record, key = create_key(keys_file, KeyHasher(b"s" * 32), "acme")
    auth, store = make_auth(keys_file)
    auth.authenticate(f"Bearer {key}")
    revoke_key(keys_file, record.key_id)
    assert store.reload() is True
    assert store.reload() is False
    with pytest.raises(InvalidApiKey):
        auth.authenticate(f"Bearer {key}")
    assert load_records(keys_file)[0].revoked_at is not None


async def test_new_key_is_seen_after_async_refresh(keys_file):
    auth, store = make_auth(keys_file)
    _, key = create_key(keys_file, KeyHasher(b"s" * 32), "acme")
    with pytest.raises(InvalidApiKey):
        auth.authenticate(f"Bearer {key}")
    assert await store.refresh()
    assert auth.authenticate(f"Bearer {key}").tenant == "acme"


def test_key_hashed_under_another_secret_does_not_verify(keys_file):
    _, key = create_key(keys_file, KeyHasher(b"a" * 32), "acme")
    auth, _ = make_auth(keys_file, secret=b"b" * 32)
    with pytest.raises(InvalidApiKey):
        auth.authenticate(f"Bearer {key}")


def test_malformed_keys_file_names_the_line(keys_file):
    keys_file.write_text('{"key_id": "x"}\n')
    with pytest.raises(KeyFileError, match=r"keys.jsonl:1"):
        KeyStore(keys_file, KeyHasher(None))


def test_auth_none_makes_every_request_local():
    p = Authenticator(AuthConfig()).authenticate(None)
    assert p.tenant == "local" and p.key_id is None


def test_bad_tenant_or_scope_is_a_clear_error(keys_file):
    with pytest.raises(ValueError, match="tenant"):
        create_key(keys_file, KeyHasher(None), "no spaces")
    with pytest.raises(ValueError, match="scope"):
        create_key(keys_file, KeyHasher(None), "acme", ["root"])
