"""Signed artifacts through the real daemon: with trusted keys, an unsigned artifact or one signed by
an unknown key is refused by name (/readyz says why) while the other models serve; a model's own
trusted_keys replace [server]'s; a reload that adds such a version keeps the old one serving."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import aiohttp
import pytest

from inferd.artifacts import publish_artifact, read_manifest, staging_dir
from inferd.artifacts.signing import fingerprint, generate_key_pair, load_private_key, load_public_key, sign_artifact
from tests.daemon.harness import complete, running, sim_model, write_config

REF = 'backend = "reference"\nmax_batch_size = 4\nmax_num_tokens = 64\nnum_kv_blocks = 64\n'


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """Two key pairs: "release" (trusted by [server]) and "team" (trusted by nobody unless a model says so)."""
    return {name: generate_key_pair(tmp_path, name) for name in ("release", "team")}


def fp(public: Path) -> str:
    return fingerprint(load_public_key(public))


def copy_artifact(tiny_artifact: Path, root: Path, name: str, signer: Path | None = None) -> Path:
    path = Path(shutil.copytree(tiny_artifact, root / name / tiny_artifact.name))
    if signer is not None:
        sign_artifact(path, load_private_key(signer))
    return path


def config(tmp_path: Path, root: Path, models: dict[str, str], server: str = "") -> Path:
    path = write_config(tmp_path / "c.toml", models)
    path.write_text(path.read_text().replace("[server]\n", f'[server]\nengines_root = "{root}"\n{server}'))
    return path


async def readyz(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(f"{url}/readyz") as resp:
        return await resp.json()


async def test_unsigned_and_unknown_signers_are_refused_by_name_while_the_rest_serve(
        tmp_path, tiny_artifact, keys, caplog):
    caplog.set_level(logging.INFO, logger="inferd.versions")
    root = tmp_path / "engines"
    copy_artifact(tiny_artifact, root, "tiny", keys["release"][0])
    copy_artifact(tiny_artifact, root, "unsigned")
    copy_artifact(tiny_artifact, root, "foreign", keys["team"][0])
    team_model = REF + 'artifact = "foreign"\ntrusted_keys = ["team.pub"]\n'    # its own list replaces [server]'s
    path = config(tmp_path, root, {"tiny": REF, "unsigned": REF, "foreign": REF, "team": team_model, "s": sim_model()},
                  'trusted_keys = ["release.pub"]\n')
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        for model in ("tiny", "team", "s"):
            status, _, _ = await complete(http, url, model)
            assert status == 200, model
        for model in ("unsigned", "foreign"):
            status, _, body = await complete(http, url, model)
            assert status == 503 and body["error"]["param"] == "model"
        refused = (await readyz(http, url))["refused"]
    assert set(refused) == {"unsigned@latest", "foreign@latest"}
    assert "unsigned, and trusted_keys requires a signature by one of: " + fp(keys["release"][1]) \
        in refused["unsigned@latest"]
    assert f"signed by {fp(keys['team'][1])}, which is not a trusted key" in refused["foreign@latest"]
    assert str(root / "foreign" / tiny_artifact.name) in refused["foreign@latest"]
    ready = {r.fields["model"]: r.fields.get("signer") for r in caplog.records if r.getMessage() == "version_ready"}
    assert ready["tiny"] == fp(keys["release"][1]) and ready["team"] == fp(keys["team"][1])


async def test_a_trusted_key_that_does_not_load_refuses_artifacts_naming_the_key(tmp_path, tiny_artifact):
    root = tmp_path / "engines"
    copy_artifact(tiny_artifact, root, "tiny")
    (tmp_path / "broken.pub").write_text("ssh-ed25519 not-a-key\n")
    path = config(tmp_path, root, {"tiny": REF, "s": sim_model()}, 'trusted_keys = ["broken.pub"]\n')
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        status, _, _ = await complete(http, url, "s")        # no artifact: nothing to sign, serves
        assert status == 200
        reason = (await readyz(http, url))["refused"]["tiny@latest"]
    assert f"trusted_keys: {tmp_path / 'broken.pub'}: not a valid ssh-ed25519 public key" in reason


def publish_changed_copy(artifact: Path) -> Path:
    """Another version of `artifact` (one byte of config.json differs), unsigned; LATEST left where it was."""
    manifest = read_manifest(artifact)
    with staging_dir(artifact.parent.parent, manifest.name) as staging:
        for rel in manifest.files:
            shutil.copy(artifact / rel, staging / rel)
        with open(staging / "config.json", "a") as fh:
            fh.write("\n")
        new = publish_artifact(staging, artifact.parent.parent, name=manifest.name, target=manifest.target,
                               source=manifest.source, architecture=manifest.architecture,
                               sampling=manifest.sampling)
    (artifact.parent / "LATEST").write_text(artifact.name + "\n")
    return new


async def test_a_reload_adding_an_unsigned_version_keeps_the_signed_one_serving(tmp_path, tiny_artifact, keys):
    root = tmp_path / "engines"
    v1 = copy_artifact(tiny_artifact, root, "tiny", keys["release"][0])
    v2 = publish_changed_copy(v1)
    path = config(tmp_path, root, {"tiny": REF}, 'trusted_keys = ["release.pub"]\n')
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        path.write_text(path.read_text().replace(REF, REF + f'versions = ["{v2.name}"]\n'))
        result = await daemon.reload()
        assert result.ok and result.failed == (f"tiny@{v2.name}",)
        status, headers, _ = await complete(http, url, "tiny")
        assert status == 200 and headers["X-Inferd-Model-Version"] == v1.name
        assert "unsigned" in (await readyz(http, url))["refused"][f"tiny@{v2.name}"]
        sign_artifact(v2, load_private_key(keys["release"][0]))       # signed now: the next reload loads it
        result = await daemon.reload()
        assert result.loaded == (f"tiny@{v2.name}",) and not (await readyz(http, url)).get("refused")
        status, headers, _ = await complete(http, url, f"tiny@{v2.name}")
        assert status == 200 and headers["X-Inferd-Model-Version"] == v2.name


async def test_an_adapter_not_signed_by_a_trusted_key_is_refused_while_the_base_model_and_a_signed_adapter_serve(
        tmp_path, tiny_artifact, keys):
    from inferd.artifacts.build.lora import build_synthetic_adapter

    root = tmp_path / "engines"
    copy_artifact(tiny_artifact, root, "tiny", keys["release"][0])
    loras = tmp_path / "loras"
    good = build_synthetic_adapter(tiny_artifact, "good", loras, seed=1)
    foreign = build_synthetic_adapter(tiny_artifact, "foreign", loras, seed=2)
    sign_artifact(good, load_private_key(keys["release"][0]))
    sign_artifact(foreign, load_private_key(keys["team"][0]))
    model = REF + f'lora_adapters = {{ good = "{loras / "good"}", foreign = "{loras / "foreign"}" }}\n'
    path = config(tmp_path, root, {"tiny": model}, 'trusted_keys = ["release.pub"]\n')
    async with running(path) as (daemon, url), aiohttp.ClientSession() as http:
        status, _, body = await complete(http, url, "tiny:foreign")
        assert status == 500 and "LoRA adapter 'foreign' was refused: it is not signed by a trusted key" \
            in body["error"]["message"] and fp(keys["team"][1]) in body["error"]["message"]
        async with http.post(f"{url}/admin/adapters", json={"model": "tiny", "adapter": "foreign",
                                                            "action": "load"}) as resp:
            answer = await resp.json()
        assert resp.status == 422 and answer["error"]["code"] == "adapter_load_failed"
        assert f"signed by {fp(keys['team'][1])}, which is not a trusted key" in answer["error"]["message"]
        assert f"file {foreign / 'manifest.sig'}" in answer["error"]["message"]
        for name in ("tiny", "tiny:good"):
            status, _, _ = await complete(http, url, name)
            assert status == 200, name
