"""A Hugging Face hub on 127.0.0.1 for tests: the HTTP calls huggingface_hub 2.4's snapshot_download makes.

- GET  /api/models/{org}/{name}/revision/{rev}   model info: {"id", "sha", "siblings"} (404 + X-Error-Code
                                                 RepoNotFound / RevisionNotFound, 401 for a private repo without
                                                 its token, as the hub answers)
- GET  /api/models/{org}/{name}/tree/{rev}       the recursive file listing (path, size, oid; lfs for weights)
- HEAD /{org}/{name}/resolve/{rev}/{file}         ETag, X-Repo-Commit, X-Linked-Size, Content-Length
- GET  the same                                  the bytes; `Range: bytes=N-` gets 206 from N

Point HF_ENDPOINT at `server.url` (inferd.artifacts.hub reads it per pull). Every request is recorded
(`requests`: method, path, Range and Authorization headers). `stall(file, after)` makes the next GET of that
file send `after` bytes, set `stalled` and hang, so a test can kill a pull mid-file on an event, not a sleep.
The server runs on a thread of its own: huggingface_hub's calls block, in-process or from a subprocess.
"""
from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web


@dataclass
class Repo:
    files: dict[str, bytes]
    token: str | None = None               # private: requests must send `Authorization: Bearer <token>`
    commit: str = ""
    refs: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(b"".join(hashlib.sha1(p.encode() + b"\0" + d).digest()
                                       for p, d in sorted(self.files.items())))
        self.commit = self.commit or digest.hexdigest()
        self.refs.setdefault("main", self.commit)

    def resolve(self, rev: str) -> str | None:
        return rev if rev == self.commit else self.refs.get(rev)


def repo_from_dir(directory: Path, **kw) -> Repo:
    """A repo holding every file of a checkpoint directory (as `save_pretrained` left it)."""
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    return Repo(files=files, **kw)


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _is_lfs(path: str) -> bool:
    return path.endswith(".safetensors")


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self.stalled = threading.Event()
        self._stall: tuple[str, int] | None = None
        self._loop = asyncio.new_event_loop()
        self._release: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="hub-fixture", daemon=True)
        self.url = ""

    # -- the test's side ------------------------------------------------------------------
    def start(self) -> HubServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def stall(self, file: str, after: int) -> None:
        self.stalled.clear()
        self._stall = (file, after)

    def gets(self, file: str) -> list[str | None]:
        """The Range header of each GET of `file` (None: from its start)."""
        return [rng for method, path, rng, _ in self.requests if method == "GET" and path.endswith("/" + file)
                and "/resolve/" in path]

    # -- the server's side ----------------------------------------------------------------
    async def _start(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self._info)
        app.router.add_get("/api/models/{org}/{name}/tree/{rev}", self._tree)
        app.router.add_get("/{org}/{name}/resolve/{rev}/{file:.+}", self._resolve)   # HEAD too
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        self._release.set()
        await self._runner.cleanup()

    def _find(self, request: web.Request) -> tuple[Repo, str, str]:
        """(repo, repo id, commit) of a request, or the hub's error response raised."""
        self.requests.append((request.method, request.path, request.headers.get("Range"),
                              request.headers.get("Authorization")))
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self.repos.get(repo_id)
        if repo is None or (repo.token and request.headers.get("Authorization") != f"Bearer {repo.token}"):
            # the hub says 401 for a private repo as for a missing one: it does not confirm it exists
            raise web.HTTPUnauthorized(headers={"X-Error-Code": "RepoNotFound"}, text="Repository not found")
        commit = repo.resolve(request.match_info["rev"])
        if commit is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RevisionNotFound"}, text="Invalid rev id")
        return repo, repo_id, commit

    async def _info(self, request: web.Request) -> web.Response:
        repo, repo_id, commit = self._find(request)
        return web.json_response({"id": repo_id, "sha": commit, "private": bool(repo.token),
                                  "siblings": [{"rfilename": p} for p in sorted(repo.files)]})

    async def _tree(self, request: web.Request) -> web.Response:
        repo, _, _ = self._find(request)
        entries = []
        for path, data in sorted(repo.files.items()):
            entry = {"type": "file", "path": path, "size": len(data), "oid": _git_oid(data)}
            if _is_lfs(path):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return web.json_response(entries)

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        repo, _, commit = self._find(request)
        name = request.match_info["file"]
        data = repo.files.get(name)
        if data is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
        etag = hashlib.sha256(data).hexdigest() if _is_lfs(name) else _git_oid(data)
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": commit, "X-Linked-Size": str(len(data)),
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        start = int(request.headers["Range"].removeprefix("bytes=").split("-")[0]) if "Range" in request.headers else 0
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        response = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(len(data) - start)})
        await response.prepare(request)
        body = data[start:]
        if self._stall is not None and self._stall[0] == name:
            after, self._stall = self._stall[1], None
            await response.write(body[:after])
            self.stalled.set()
            await self._release.wait()          # until the server stops: the test kills the client first
            return response
        await response.write(body)
        await response.write_eof()
        return response
