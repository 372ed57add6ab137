"""`inferd pull` and inferd.artifacts.hub against a loopback hub (tests/hub_server.py), never the internet.

The repo the hub serves is the `tiny` synthetic checkpoint's files (an HF Llama layout, no torch needed)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferd.__main__ import build_parser
from inferd.artifacts import MANIFEST_FILE, ArtifactError, pull_main, read_manifest, verify_artifact
from inferd.artifacts.build import build_synthetic
from inferd.artifacts.hub import HubError, pull
from tests.hub_server import HubServer, Repo, repo_from_dir

REPO = "acme/tiny-llama"


def main(argv: list[str]) -> int:
    """`inferd pull ...` as the CLI parses and runs it, less its logging setup (the test's stderr is captured)."""
    return pull_main(build_parser().parse_args(argv), Path("unused-default"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An HF checkpoint directory: the tiny synthetic artifact's files, less its manifest."""
    built = build_synthetic("tiny", tmp_path_factory.mktemp("built"), progress=lambda _: None)
    (built / MANIFEST_FILE).unlink()
    return built


@pytest.fixture
def hub(checkpoint, monkeypatch):
    server = HubServer().start()
    server.repos[REPO] = repo_from_dir(checkpoint)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    yield server
    server.stop()


def test_pull_packs_the_hub_checkpoint_with_its_commit_pinned_in_the_manifest(hub, tmp_path):
    path = pull(REPO, tmp_path / "engines", cache_dir=tmp_path / "cache", progress=lambda _: None)
    manifest = verify_artifact(path)
    assert path.parent.name == "tiny-llama" and manifest.name == "tiny-llama"
    assert manifest.source == f"hf:{REPO}"
    assert manifest.revision == hub.repos[REPO].commit          # main, resolved to its commit
    assert set(manifest.files) == set(hub.repos[REPO].files)


def test_pull_of_a_tag_records_the_commit_it_points_at(hub, tmp_path):
    repo = hub.repos[REPO]
    repo.refs["v1"] = repo.commit
    path = pull(REPO, tmp_path / "engines", revision="v1", cache_dir=tmp_path / "cache", progress=lambda _: None)
    assert read_manifest(path).revision == repo.commit


def test_pull_sends_hf_token_and_a_private_repo_needs_it(hub, tmp_path, monkeypatch):
    hub.repos["acme/private"] = Repo(files=hub.repos[REPO].files, token="hf_secret")
    with pytest.raises(HubError, match="HF_TOKEN"):
        pull("acme/private", tmp_path / "engines", cache_dir=tmp_path / "cache")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    path = pull("acme/private", tmp_path / "engines", cache_dir=tmp_path / "cache", progress=lambda _: None)
    assert read_manifest(path).source == "hf:acme/private"
    assert ("GET", f"/api/models/acme/private/revision/main", None, "Bearer hf_secret") in hub.requests


def test_pull_fetches_only_what_the_engine_reads(hub, tmp_path):
    files = dict(hub.repos[REPO].files)
    files.update({"pytorch_model.bin": b"x" * 100, "onnx/model.onnx": b"y" * 100, "README.md": b"# tiny\n"})
    hub.repos["acme/mixed"] = Repo(files=files)
    pull("acme/mixed", tmp_path / "engines", cache_dir=tmp_path / "cache", progress=lambda _: None)
    fetched = {path.rsplit("/", 1)[-1] for method, path, _, _ in hub.requests if method == "GET" and "/resolve/" in path}
    assert fetched == set(hub.repos[REPO].files)


def test_cli_pull_of_an_unknown_repo_exits_1_with_one_line_and_no_traceback(hub, tmp_path, capsys):
    code = main(["pull", "acme/no-such-model", "--engines-root", str(tmp_path / "engines")])
    err = capsys.readouterr().err
    assert code == 1
    assert "acme/no-such-model: no such model on http://127.0.0.1" in err and "Traceback" not in err


def test_cli_pull_of_an_unknown_revision_names_it(hub, tmp_path, capsys):
    assert main(["pull", REPO, "--revision", "v9", "--engines-root", str(tmp_path / "e")]) == 1
    assert "has no revision 'v9'" in capsys.readouterr().err


def test_cli_pull_of_a_local_checkout_packs_it(checkpoint, tmp_path, capsys):
    assert main(["pull", str(checkpoint), "--name", "mine", "--engines-root", str(tmp_path / "engines")]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent == tmp_path / "engines" / "mine"
    assert read_manifest(path).source == f"local:{checkpoint.resolve()}" and read_manifest(path).revision is None


def _pull_process(tmp_path: Path, hub: HubServer) -> subprocess.Popen:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
    return subprocess.Popen([sys.executable, "-m", "inferd", "pull", REPO, "--engines-root", str(tmp_path / "engines")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_pull_killed_mid_file_reruns_without_refetching_the_files_it_completed(hub, tmp_path):
    repo = hub.repos[REPO]
    weights = len(repo.files["model.safetensors"])
    hub.stall("model.safetensors", after=weights // 2)
    snapshot = tmp_path / "hf" / "hub" / "models--acme--tiny-llama" / "snapshots" / repo.commit
    others = [f for f in repo.files if f != "model.safetensors"]
    proc = _pull_process(tmp_path, hub)
    try:
        assert hub.stalled.wait(60), "the pull never reached the weights"
        _wait_for(lambda: all((snapshot / f).exists() for f in others), "the small files to complete")
        blobs = snapshot.parent.parent / "blobs"
        _wait_for(lambda: any(blobs.glob("*.incomplete")), "the partial weights file")
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert not (snapshot / "model.safetensors").exists()
    gets_before = {f: len(hub.gets(f)) for f in repo.files}

    rerun = _pull_process(tmp_path, hub)
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert {f: len(hub.gets(f)) - gets_before[f] for f in repo.files} == {
        **{f: 0 for f in others}, "model.safetensors": 1}       # only the file that was cut off
    assert not any(blobs.glob("*.incomplete"))                   # the killed pull's partial is cleaned up
    manifest = verify_artifact(Path(out.strip()))
    assert manifest.revision == repo.commit and "pull_progress" in err     # not a terminal: log lines


def test_build_engines_hf_model_pulls_at_a_revision_and_prints_the_artifact(hub, tmp_path, capsys, monkeypatch):
    from tests.artifacts.build.test_reference import load_build_engines

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))   # read at its import
    hub.repos[REPO].refs["v1"] = hub.repos[REPO].commit
    build_engines = load_build_engines()
    assert build_engines.main(["--engines-root", str(tmp_path / "e"), "--hf-model", REPO, "--revision", "v1"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.parent == tmp_path / "e" / "tiny-llama" and read_manifest(path).revision == hub.repos[REPO].commit
    assert build_engines.main(["--engines-root", str(tmp_path / "e"), "--hf-model", "acme/nope"]) == 1
    assert "acme/nope: no such model" in capsys.readouterr().err


def test_a_second_pull_with_no_hub_reachable_packs_the_cached_copy(hub, tmp_path, monkeypatch):
    first = pull(REPO, tmp_path / "engines", cache_dir=tmp_path / "cache", progress=lambda _: None)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")             # nothing listens there
    again = pull(REPO, tmp_path / "engines", cache_dir=tmp_path / "cache", progress=lambda _: None)
    assert again == first and read_manifest(again).revision == hub.repos[REPO].commit


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal as Linux has it")
def test_on_a_terminal_pull_shows_huggingface_hubs_progress_bars(hub, tmp_path):
    import fcntl
    import pty
    import select
    import struct
    import termios

    main_fd, term_fd = pty.openpty()
    fcntl.ioctl(term_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # tqdm draws nothing 0 wide
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    proc = subprocess.Popen([sys.executable, "-m", "inferd", "pull", REPO, "--engines-root", str(tmp_path / "e")],
                            env=env, stdout=subprocess.DEVNULL, stderr=term_fd)
    os.close(term_fd)
    shown = b""
    try:
        while select.select([main_fd], [], [], 120)[0]:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:                   # EIO: the terminal's other end closed (the pull exited)
                break
            if not chunk:
                break
            shown += chunk
        assert proc.wait(60) == 0, shown
    finally:
        os.close(main_fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = shown.decode(errors="replace")
    assert "Fetching 5 files: 100%" in text and "pull_progress" not in text


def test_a_model_the_engine_cannot_run_is_refused_before_its_weights_are_fetched(hub, tmp_path):
    files = dict(hub.repos[REPO].files)
    files["config.json"] = b'{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}'
    hub.repos["acme/gpt2ish"] = Repo(files=files)
    with pytest.raises(ArtifactError, match=r"\['GPT2LMHeadModel'\]; the reference engine runs only LlamaForCausalLM"):
        pull("acme/gpt2ish", tmp_path / "engines", cache_dir=tmp_path / "cache")
    assert hub.gets("config.json") and not hub.gets("model.safetensors")
