"""inferd.tenancy.tenancy: the live keys/tenants/quota/admission objects, and what a reload does to them."""
from __future__ import annotations

import asyncio

import msgspec
import pytest

from inferd.admission.fair_queue import AdmissionRejected
from inferd.config import AuthConfig, Config, ServerConfig, TlsConfig
from inferd.config.root import parse_config
from inferd.engine.sim.engine import SimEngine
from inferd.tenancy.keys import InvalidApiKey, KeyHasher, create_key, revoke_key
from inferd.tenancy.tenancy import Tenancy, many_senders
from inferd.types import GenerationRequest, SamplingParams


def config(tmp_path, *, mode="api_key", tenants=None, admission=None):
    return parse_config({"auth": {"mode": mode, "keys_file": "keys.jsonl"}, "tenants": tenants or {},
                         "admission": admission or {}},
                        base_dir=tmp_path)


@pytest.fixture
async def engine():
    e = SimEngine("tiny", time_scale=0.0, max_batch_size=1)
    await e.start()
    yield e
    await e.close()


async def test_reload_rereads_keys_so_revoked_keys_stop_working(tmp_path):
    _, key = create_key(tmp_path / "keys.jsonl", KeyHasher(None), "acme")
    cfg = config(tmp_path)
    tenancy = Tenancy(cfg)
    assert tenancy.authenticator.authenticate(f"Bearer {key}").tenant == "acme"
    revoke_key(tmp_path / "keys.jsonl", key.split("_")[1])
    tenancy.reconfigure(cfg)
    await tenancy.settled()
    with pytest.raises(InvalidApiKey):
        tenancy.authenticator.authenticate(f"Bearer {key}")
    await tenancy.close()


async def test_reload_that_turns_auth_on_builds_a_new_authenticator(tmp_path):
    _, key = create_key(tmp_path / "keys.jsonl", KeyHasher(None), "acme")
    tenancy = Tenancy(config(tmp_path, mode="none"))
    assert tenancy.authenticator.authenticate(None).tenant == "local"
    tenancy.reconfigure(config(tmp_path))
    await tenancy.settled()
    assert tenancy.authenticator.authenticate(f"Bearer {key}").tenant == "acme"
    with pytest.raises(InvalidApiKey):
        tenancy.authenticator.authenticate("Bearer inf_000000000000_nope")
    await tenancy.close()


async def test_reload_swaps_tenants_and_policy_without_dropping_queued_work(tmp_path, engine):
    tenancy = Tenancy(config(tmp_path, mode="none", tenants={"a": {"weight": 1.0}}))
    queue = tenancy.queue_for("sim", engine)
    assert tenancy.queue_for("sim", engine) is queue          # one queue per engine

    def req(i: int) -> GenerationRequest:
        return GenerationRequest(request_id=f"r{i}", prompt_token_ids=(1, 2, 3), tenant="a",
                                 sampling=SamplingParams(max_tokens=50, ignore_eos=True))

    running = await queue.admit(req(0), deadline=float("inf"))   # takes the only slot
    waiting = asyncio.ensure_future(queue.admit(req(1), deadline=float("inf")))
    while queue.snapshot()["queued"] == 0:
        await asyncio.sleep(0)
    tenancy.reconfigure(config(tmp_path, mode="none", tenants={"a": {"weight": 4.0}},
                               admission={"batch_ttl_s": 5.0}))
    assert tenancy.tenants.get("a").weight == 4.0
    assert queue.tenants is tenancy.tenants and queue.policy.batch_ttl_s == 5.0
    assert queue.snapshot()["queued"] == 1                  # still queued, not dropped
    await running.collect()
    second = await waiting                                  # released once the slot frees
    await second.collect()
    await tenancy.close()


async def test_closed_tenancy_refuses_new_work_as_draining(tmp_path, engine):
    tenancy = Tenancy(config(tmp_path, mode="none"))
    await tenancy.close()
    with pytest.raises(AdmissionRejected) as exc:
        tenancy.queue_for("sim", engine)
    assert exc.value.status == 503 and exc.value.reason == "draining"


async def test_metrics_labels_are_configured_tenants_and_other(tmp_path):
    tenancy = Tenancy(config(tmp_path, mode="none", tenants={"acme": {}}))
    for tenant in ("acme", "stranger-1", "stranger-2"):
        tenancy.count_rejection(tenant, "limit")
    snap = tenancy.metrics_snapshot()
    assert snap["rejections"] == {"acme": {"limit": 1}, "other": {"limit": 2}}
    await tenancy.close()


def test_only_one_tenant_sends_with_auth_mode_none_and_no_certificate_tenants_or_peers():
    assert not many_senders(Config())
    assert many_senders(Config(auth=AuthConfig(mode="api_key")))
    tls = TlsConfig(cert_file="c.pem", key_file="k.pem", client_ca_file="ca.pem")
    assert not many_senders(Config(server=ServerConfig(tls=msgspec.structs.replace(
        tls, tenant_by_subject={"CN=me": "local"}))))
    assert many_senders(Config(server=ServerConfig(tls=msgspec.structs.replace(
        tls, tenant_by_subject={"CN=alice": "alice"}))))
