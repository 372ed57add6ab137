import re
from pathlib import Path

import msgspec
import pytest

from inferd import tomllib
from inferd.config.root import parse_config
from inferd.config.tenants import (
    AdmissionConfig,
    AuthConfig,
    InsecureBindError,
    PriorityClass,
    TenantConfig,
    TenantRegistry,
    admission_errors,
    check_auth_binding,
    tenant_errors,
)


def test_tenant_table_decodes_from_toml_values():
    t = msgspec.convert({"weight": 3, "priority": "interactive", "requests_per_minute": 60,
                         "allowed_models": ["small"]}, TenantConfig)
    assert t.weight == 3.0 and t.priority is PriorityClass.INTERACTIVE
    assert t.allows_model("small") and not t.allows_model("big")


def test_unknown_tenant_key_is_rejected_by_name():
    with pytest.raises(msgspec.ValidationError, match="wieght"):
        msgspec.convert({"wieght": 2}, TenantConfig)


def test_unknown_priority_class_is_rejected():
    with pytest.raises(msgspec.ValidationError, match="priority"):
        msgspec.convert({"priority": "urgent"}, TenantConfig)


def test_semantic_errors_name_every_bad_field():
    bad = TenantConfig(weight=0, requests_per_minute=-1, max_queued_requests=0, allowed_models=())
    errors = tenant_errors("acme", bad)
    for field in ("weight", "requests_per_minute", "max_queued_requests", "allowed_models"):
        assert any(e.startswith(f"tenants.acme.{field}:") for e in errors), (field, errors)
    assert tenant_errors("acme", TenantConfig()) == []
    assert tenant_errors("bad name!", TenantConfig())[0].startswith("tenants.bad name!:")


def test_admission_shares_must_leave_room_for_higher_classes():
    errors = admission_errors(AdmissionConfig(standard_reserved_share=0.6, batch_reserved_share=0.5))
    assert any("standard_reserved_share + batch_reserved_share" in e for e in errors)
    assert admission_errors(AdmissionConfig()) == []


def test_registry_defaults_unlisted_tenants_and_bounds_labels():
    reg = TenantRegistry({"acme": TenantConfig(weight=2), "default": TenantConfig(weight=0.5)})
    assert reg.get("acme").weight == 2
    assert reg.get("stranger").weight == 0.5
    assert reg.label("acme") == "acme" and reg.label("stranger") == "other" and reg.label("local") == "local"
    assert reg.names == ("acme",)


def test_auth_off_on_loopback_is_allowed():
    check_auth_binding(AuthConfig(), "127.0.0.1")
    check_auth_binding(AuthConfig(), "::1")


def test_auth_off_on_a_public_address_is_refused_unless_explicit():
    with pytest.raises(InsecureBindError, match="allow_unauthenticated_non_loopback"):
        check_auth_binding(AuthConfig(), "0.0.0.0")
    check_auth_binding(AuthConfig(allow_unauthenticated_non_loopback=True), "0.0.0.0")
    check_auth_binding(AuthConfig(mode="api_key"), "10.0.0.5")


def test_every_toml_example_in_docs_tenants_md_is_a_valid_config():
    text = (Path(__file__).resolve().parents[2] / "docs" / "tenants.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    for block in blocks:
        parse_config(tomllib.loads(block))       # raises ConfigError naming any key the docs get wrong
