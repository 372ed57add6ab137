"""`inferd serve --model X` with vLLM's flags and no config file (inferd.daemon.serve_model).

The checkpoint is a random SmolLM2-shaped one (tests/hf_checkpoints.py); hub ids are served by the loopback
hub (tests/hub_server.py). One test runs the real process and talks to it with the openai SDK."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from inferd.__main__ import build_parser, main
from inferd.config import ConfigError
from inferd.daemon.serve_model import model_config
from tests.daemon.test_lifecycle import read_event
from tests.hf_checkpoints import save_checkpoint
from tests.hub_server import HubServer, repo_from_dir


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("hf") / "SmolLM2-tiny"
    save_checkpoint(directory, "smollm2")
    return directory


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("INFERD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("INFERD_API_KEY", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))   # read at its import
    return tmp_path / "state"


def serve_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_a_local_checkout_is_packed_into_the_state_dir_and_served_by_its_name(checkpoint, state):
    config = model_config(serve_args("--model", str(checkpoint)))
    assert list(config.models) == ["SmolLM2-tiny"]
    model = config.models["SmolLM2-tiny"]
    assert (model.backend, model.artifact, model.max_model_len) == ("reference", "SmolLM2-tiny", None)
    assert config.server.engines_root == str(state / "engines") and config.server.state_dir == str(state)
    assert (config.server.host, config.server.port, config.auth.mode) == ("127.0.0.1", 8000, "none")
    assert (state / "engines" / "SmolLM2-tiny" / model.version / "manifest.toml").is_file()


def test_flags_become_the_keys_a_config_file_would_set(checkpoint, state):
    config = model_config(serve_args("--model", str(checkpoint), "--served-model-name", "smol", "--port", "0",
                                     "--host", "127.0.0.1", "--max-model-len", "64", "--api-key", "k-123"))
    assert list(config.models) == ["smol"] and config.models["smol"].max_model_len == 64
    assert config.server.port == 0 and config.auth.mode == "api_key"
    assert config.auth.static_key_sha256 and "k-123" not in config.auth.static_key_sha256   # only its hash


def test_the_api_key_may_come_from_inferd_api_key_instead_of_the_command_line(checkpoint, state, monkeypatch):
    monkeypatch.setenv("INFERD_API_KEY", "k-env")
    config = model_config(serve_args("--model", str(checkpoint)))
    assert config.auth.mode == "api_key"
    assert config.auth.static_key_sha256 == hashlib.sha256(b"k-env").hexdigest()


def test_an_artifact_is_found_by_name_or_directory_once_packed(checkpoint, state):
    packed = model_config(serve_args("--model", str(checkpoint), "--served-model-name", "smol"))
    assert packed.models["smol"].artifact == "SmolLM2-tiny"      # named after its checkout, served as asked
    assert model_config(serve_args("--model", "SmolLM2-tiny")).models["SmolLM2-tiny"].version == "latest"
    by_dir = model_config(serve_args("--model", str(state / "engines" / "SmolLM2-tiny"), "--served-model-name", "b"))
    assert by_dir.models["b"].artifact == "SmolLM2-tiny" and by_dir.models["b"].version == "latest"


def test_a_hub_id_is_pulled_and_served_by_the_repo_name(checkpoint, state, monkeypatch, tmp_path):
    hub = HubServer().start()
    try:
        hub.repos["acme/SmolLM2-hub"] = repo_from_dir(checkpoint)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        config = model_config(serve_args("--model", "acme/SmolLM2-hub"))
    finally:
        hub.stop()
    assert config.models["SmolLM2-hub"].artifact == "SmolLM2-hub"
    assert config.server.engines_root == str(state / "engines")


@pytest.mark.parametrize(("argv", "says"), [
    (["--model", "no/such-dir-or-model"], "--model no/such-dir-or-model: no/such-dir-or-model: cannot download"),
    (["--model", "just-a-name"], "not a checkpoint or artifact directory"),
    (["--max-model-len", "100000"], "--max-model-len 100000: this model's context is 1..256 tokens"),
    (["--served-model-name", "org/smol"], "--served-model-name 'org/smol': must match"),
    (["--host", "0.0.0.0"], "server.host"),
    (["--dtype", "float16"], "--dtype: only with --backend torch"),
    (["--backend", "torch", "--device", "gpu0"], "models.SmolLM2-tiny.torch.device: expected"),
    (["--backend", "torch", "--gpu-memory-utilization", "1.5"], "models.SmolLM2-tiny.torch.gpu_memory_utilization"),
])
def test_bad_flags_are_a_config_error_naming_them(checkpoint, state, monkeypatch, argv, says):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")       # nothing listens: no hub reachable
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    args = serve_args(*(argv if argv[0] == "--model" else ["--model", str(checkpoint), *argv]))
    with pytest.raises(ConfigError) as caught:
        model_config(args)
    assert caught.value.source == "command line" and says in "\n".join(caught.value.errors)


def test_the_torch_engine_takes_vllms_flags(checkpoint, state):
    config = model_config(serve_args("--model", str(checkpoint), "--backend", "torch", "--device", "cpu", "--dtype",
                                     "float32", "--gpu-memory-utilization", "0.5", "--enforce-eager",
                                     "--load-format", "dummy"))
    model = config.models["SmolLM2-tiny"]
    t = model.torch
    assert model.backend == "torch"
    assert (t.device, t.dtype, t.gpu_memory_utilization, t.cuda_graphs, t.load_format) == (
        "cpu", "float32", 0.5, False, "dummy")
    auto = model_config(serve_args("--model", str(checkpoint), "--backend", "torch", "--dtype", "auto"))
    assert auto.models["SmolLM2-tiny"].torch.dtype == "bfloat16"


@pytest.mark.parametrize("argv", [["--api-key", "k"], ["--max-model-len", "64"], ["--model", "x", "--config", "c.toml"],
                                  ["--backend", "torch"], ["--enforce-eager"]])
def test_vllm_flags_without_model_or_with_config_exit_2(argv, capsys):
    assert main(["serve", *argv]) == 2
    assert "--model" in capsys.readouterr().err


async def _serve(state: Path, *argv: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "INFERD_STATE_DIR": str(state), "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HOME": str(state.parent / "hf")}
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "inferd", "serve", *argv, env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)


@contextlib.asynccontextmanager
async def _serving(state: Path, *argv: str) -> AsyncIterator[int]:
    """`inferd serve *argv` until ready: its port; a clean SIGTERM exit is checked when the block ends."""
    proc = await _serve(state, *argv)
    seen: list[dict] = []
    try:
        port = (await asyncio.wait_for(read_event(proc, "listening", seen), 120))["port"]
        await asyncio.wait_for(read_event(proc, "ready", seen), 120)
        yield port
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_serve_model_runs_a_checkpoint_with_no_config_file_for_the_openai_sdk(checkpoint, tmp_path):
    async with _serving(tmp_path / "state", "--model", str(checkpoint), "--port", "0", "--served-model-name",
                        "smol", "--api-key", "sk-test", "--max-model-len", "64") as port:
        base = f"http://127.0.0.1:{port}/v1"
        async with openai.AsyncOpenAI(base_url=base, api_key="sk-test", max_retries=0) as client:
            [model] = (await client.models.list()).data
            assert model.id == "smol" and model.max_model_len == 64
            reply = await client.chat.completions.create(
                model="smol", messages=[{"role": "user", "content": "The capital of France is"}], max_tokens=4)
            assert reply.choices[0].finish_reason in ("length", "stop") and reply.usage.completion_tokens >= 1
            with pytest.raises(openai.BadRequestError) as long:        # 80 byte tokens > --max-model-len 64
                await client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "x" * 80}])
            assert long.value.code == "context_length_exceeded"
        async with openai.AsyncOpenAI(base_url=base, api_key="wrong", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()


async def test_the_torch_engine_serves_a_checkpoint_on_the_cpu_for_the_openai_sdk(checkpoint, tmp_path):
    pytest.importorskip("torch")
    async with _serving(tmp_path / "state", "--model", str(checkpoint), "--port", "0", "--backend", "torch",
                        "--device", "cpu", "--dtype", "float32", "--max-model-len", "128") as port:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="SmolLM2-tiny", messages=[{"role": "user", "content": "The capital of France is"}],
                max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
            assert chunks[-1].usage.completion_tokens >= 1
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
        metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        assert 'backend="torch"' in metrics


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


async def test_serve_model_of_an_unknown_hub_id_exits_1_naming_it_without_a_traceback(tmp_path):
    proc = await _serve(tmp_path / "state", "--model", "acme/no-such-model")
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 1
    assert b"acme/no-such-model" in err and b"invalid_config" in err and b"Traceback" not in err


def test_a_static_key_in_a_config_file_must_be_a_sha256():
    from inferd.config import parse_config

    with pytest.raises(ConfigError, match=r"auth.static_key_sha256: expected the key's SHA-256"):
        parse_config({"auth": {"mode": "api_key", "static_key_sha256": "sk-plain-key"}})
