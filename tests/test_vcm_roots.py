"""File access roots: a page source reads only under `vcm.allowed_roots` (symlinks resolved, per
file), within its caps, off the event loop; the API answers 403/413 and the `analyze` agent's run
fails with the same message."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from colony.api.app import ApiServices, create_app
from colony.blackboard import Blackboard
from colony.config import ColonySettings, ServeSettings, VcmSettings, load_settings
from colony.errors import InvalidArgument, PathNotAllowed, SourceTooLarge
from colony.inference.scripted import ScriptedEngine
from colony.system.analyze import analyze_blueprint
from colony.system.control import ControlPlane
from colony.system.host import ReplicaHost
from colony.system.runs import RunService
from colony.vcm import PageInfo, PageSource
from colony.vcm import pages as pages_module
from colony.vcm.page import Page
from colony.vcm.pages import default_roots_env

SECRET = "TOP-SECRET-OUTSIDE-THE-ROOT"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """`allowed/` (code, plus symlinks leading out) next to `outside/` (a secret)."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (allowed / "main.py").write_text("def main():\n    return 0\n")
    (allowed / "pkg" / "util.py").write_text("def util():\n    return 1\n")
    (allowed / "leak.txt").symlink_to(outside / "secret.txt")  # a file symlink out
    (allowed / "leakdir").symlink_to(outside, target_is_directory=True)  # a folder symlink out
    (allowed / "passwd").symlink_to("/etc/passwd")
    return allowed, outside


def text_of(source: PageSource) -> str:
    return "\n".join(page.text for _, page in source.pages())


def test_a_folder_under_a_root_maps_and_symlinks_out_are_skipped(layout: tuple[Path, Path]) -> None:
    allowed, _ = layout
    source = PageSource(allowed, allowed_roots=[allowed], page_tokens=256)
    text = text_of(source)
    assert "def main" in text and "def util" in text
    assert SECRET not in text and "root:" not in text
    assert [str(p.relative_to(allowed)) for p in source.files()] == ["main.py", "pkg/util.py"]
    assert sorted(source.skipped) == ["leak.txt", "passwd"]  # the folder symlink is not even entered
    inner = allowed / "pkg" / "alias.py"
    inner.symlink_to(allowed / "main.py")  # a symlink that stays inside the roots is read
    assert "alias.py" in {p.name for p in PageSource(allowed, allowed_roots=[allowed]).files()}


@pytest.mark.parametrize(
    "where",
    ["/etc", "~", "/", "allowed/../outside", "allowed/pkg/../../outside", "allowed/leakdir", "outside"],
)
def test_paths_outside_the_roots_are_refused(layout: tuple[Path, Path], where: str) -> None:
    allowed, _ = layout
    path = where if where.startswith(("/", "~")) else str(allowed.parent / where)
    with pytest.raises(PathNotAllowed, match=r"vcm\.allowed_roots"):
        PageSource(path, allowed_roots=[allowed])


def test_refusal_says_nothing_about_what_exists_outside(layout: tuple[Path, Path]) -> None:
    allowed, outside = layout
    for path in (outside, outside / "no-such-folder"):  # existing or not: the same refusal
        with pytest.raises(PathNotAllowed) as refused:
            PageSource(path, allowed_roots=[allowed])
        assert str(outside) not in str(refused.value).split(" is outside")[1]


def test_no_roots_refuses_everything_and_says_how_to_allow(layout: tuple[Path, Path]) -> None:
    allowed, _ = layout
    with pytest.raises(PathNotAllowed, match=r"vcm\.allowed_roots is empty.*COLONY_VCM__ALLOWED_ROOTS"):
        PageSource(allowed, allowed_roots=[])
    with pytest.raises(PathNotAllowed):
        PageSource.from_settings(allowed, VcmSettings())


def test_git_checkout_cannot_list_a_tracked_symlink_out(layout: tuple[Path, Path]) -> None:
    import subprocess

    allowed, _ = layout
    subprocess.run(["git", "init", "-q", str(allowed)], check=True)
    subprocess.run(["git", "-C", str(allowed), "add", "main.py", "leak.txt", "passwd"], check=True)
    source = PageSource(allowed, allowed_roots=[allowed])
    assert [p.name for p in source.files()] == ["main.py"] and SECRET not in text_of(source)
    assert sorted(source.skipped) == ["leak.txt", "passwd"]


def test_special_files_are_skipped_not_read(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a = 1\n")
    os.mkfifo(tmp_path / "pipe")  # opening a FIFO for reading would block the walk forever
    source = PageSource(tmp_path, allowed_roots=[tmp_path])
    assert [p.name for p in source.files()] == ["a.py"] and source.skipped == ["pipe"]


def test_a_fifo_in_the_git_folder_does_not_hold_the_mapping(tmp_path: Path) -> None:
    """Found by review: git opened a FIFO `.git/index` and blocked every mapping for 60 s; the
    folder is now walked instead (its `.git` left out, as always)."""
    import subprocess
    import time

    folder = tmp_path / "src"
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    (folder / "a.py").write_text("a = 1\n")
    (folder / ".git" / "index").unlink(missing_ok=True)
    os.mkfifo(folder / ".git" / "index")
    started = time.monotonic()
    assert [p.name for p in PageSource(folder, allowed_roots=[tmp_path]).files()] == ["a.py"]
    assert time.monotonic() - started < 5  # (was 60 s, git's timeout)
    (folder / ".git").rename(tmp_path / "meta")  # a worktree's pointer to a git folder with a FIFO
    (folder / ".git").write_text("gitdir: ../meta\n")
    assert [p.name for p in PageSource(folder, allowed_roots=[tmp_path]).files()] == ["a.py"]


def test_cutting_a_file_of_short_lines_is_linear(tmp_path: Path) -> None:
    """Found by review: every line recounted the whole piece, so half a megabyte of line feeds took
    25 s at 8,192-token pages; the pages themselves are the same as before."""
    import time

    (tmp_path / "lines.txt").write_text("\n" * (1 << 19))
    started = time.monotonic()
    pages = list(PageSource(tmp_path, allowed_roots=[tmp_path], page_tokens=8192).pages())
    assert time.monotonic() - started < 3.0 and len(pages) == 17
    assert all(info.tokens <= 8192 for info, _ in pages)


def test_a_file_name_that_is_not_utf8_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """Found by review: such a name (os.walk's surrogate escapes) reached a page's header and the
    page's hash failed (a 500); it is skipped, named with backslash escapes."""
    (tmp_path / "a.py").write_text("a = 1\n")
    (tmp_path / b"bad\xff.py".decode("utf-8", "surrogateescape")).write_text("b = 2\n")
    source = PageSource(tmp_path, allowed_roots=[tmp_path])
    pages = list(source.pages())
    assert len(pages) == 1 and "a = 1" in pages[0][1].text
    assert source.skipped == ["bad\\udcff.py"]


def test_a_folder_swapped_for_a_symlink_after_the_check_is_not_followed(layout: tuple[Path, Path]) -> None:
    """TOCTOU: the files are checked, then a folder on the way is swapped for a symlink out of the
    root before they are read (what a racing attacker does): the read fails, it does not follow."""
    allowed, outside = layout
    folder = allowed / "d"
    folder.mkdir()
    (folder / "secret.txt").write_text("decoy " * 100)  # at least the target's size
    source = PageSource(allowed, allowed_roots=[allowed])
    entries = {entry.relative: entry for entry in source._entries()}
    checked, intact = entries[os.path.join("d", "secret.txt")], entries[os.path.join("pkg", "util.py")]
    (folder / "secret.txt").unlink()
    folder.rmdir()
    folder.symlink_to(outside, target_is_directory=True)  # the swap, between the check and the read
    assert pages_module._read(checked) is None  # before the fix: the secret outside the root
    assert not pages_module._is_text(checked.real, checked.root)
    assert pages_module._read(intact) == "def util():\n    return 1\n"  # untouched folders still read


def test_caps_on_files_and_bytes(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}.py").write_text(f"x{i} = {'1' * 300}\n")
    assert len(PageSource(tmp_path, allowed_roots=[tmp_path], max_files=5).files()) == 5
    with pytest.raises(SourceTooLarge, match=r"more than 4 text files \(vcm\.max_files_per_source\)"):
        PageSource(tmp_path, allowed_roots=[tmp_path], max_files=4).files()
    with pytest.raises(SourceTooLarge, match=r"more than 1024 bytes .*vcm\.max_bytes_per_source"):
        list(PageSource(tmp_path, allowed_roots=[tmp_path], max_bytes=1024).pages())
    # binary files count toward what is looked at (found by review: probed without a bound)
    for i in range(25):
        (tmp_path / f"b{i}.bin").write_bytes(b"\x00\x01" * 10)
    assert len(PageSource(tmp_path, allowed_roots=[tmp_path], max_files=5).files()) == 5  # 30 <= 50
    with pytest.raises(SourceTooLarge, match=r"more than 20 files, binary ones included"):
        PageSource(tmp_path, allowed_roots=[tmp_path], max_files=2).files()


async def test_open_walks_in_a_worker_thread(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a = 1\n")
    walked_on: list[int] = []

    class Recorded(PageSource):
        def _pages(self) -> Iterator[tuple[PageInfo, Page]]:
            walked_on.append(threading.get_ident())
            return super()._pages()

    source = await Recorded.open(tmp_path, VcmSettings(allowed_roots=[tmp_path]), page_tokens=128)
    assert walked_on and walked_on[0] != threading.get_ident()  # not the event loop's thread
    assert len(list(source.pages())) == 1 and len(walked_on) == 1  # pages() replays the cut


def test_colony_up_passes_its_cwd_or_the_configured_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`colony up` puts this environment into its daemon's: the daemon's settings then hold the
    folder `colony up` ran in, or the roots it was configured with."""
    for vcm, expected in (
        (VcmSettings(), [tmp_path]),
        (VcmSettings(allowed_roots=[tmp_path / "a", tmp_path / "b"]), [tmp_path / "a", tmp_path / "b"]),
    ):
        for name, value in default_roots_env(vcm, cwd=tmp_path).items():
            monkeypatch.setenv(name, value)
        assert ColonySettings().vcm.allowed_roots == expected


# -- the API ------------------------------------------------------------------------------------------


@pytest.fixture
async def api(bb: Blackboard, redis_url: str, layout: tuple[Path, Path]) -> AsyncIterator[Any]:
    from colony.vcm import PageTable

    allowed, _ = layout
    settings = ColonySettings(redis_url=redis_url, colony_id=f"roots{uuid.uuid4().hex[:8]}")
    host = ReplicaHost(settings, "replica-a", engine=ScriptedEngine(["ok"]))
    await host.start(bb)
    assert host.registry is not None
    runs = RunService(bb, host.registry, colony_id=settings.colony_id, settings=load_settings())
    pages = PageTable(bb, colony_id=settings.colony_id, settings=load_settings())

    def client(vcm: VcmSettings | None) -> httpx.AsyncClient:
        services = ApiServices(runs=runs, registry=host.registry, token="t", pages=pages, vcm=vcm)
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(services)),
            base_url="http://colony",
            headers={"Authorization": "Bearer t"},
        )

    yield client, allowed
    await host.close()


async def test_api_maps_only_under_the_roots(api: Any) -> None:
    client, allowed = api
    async with client(VcmSettings(allowed_roots=[allowed], max_files_per_source=2)) as http:
        ok = await http.post("/v1/vcm/sources", json={"path": str(allowed), "page_tokens": 256})
        assert ok.status_code == 200, ok.text
        assert {s["path"] for p in ok.json()["pages"] for s in p["files"]} == {"main.py", "pkg/util.py"}
        assert SECRET not in ok.text
        for path in ("/etc", "~", str(allowed / ".." / "outside"), str(allowed / "leakdir")):
            refused = await http.post("/v1/vcm/sources", json={"path": path})
            assert refused.status_code == 403, (path, refused.text)
            assert "vcm.allowed_roots" in refused.json()["error"]["message"]
        for hostile in ("a\u0000b", "~no-such-user-here", "/" * 4000):  # refused, never a 5xx
            answer = await http.post("/v1/vcm/sources", json={"path": hostile})
            assert answer.status_code in (400, 403, 422), (hostile[:20], answer.text)
        (allowed / "pkg" / "more.py").write_text("y = 2\n")
        too_many = await http.post("/v1/vcm/sources", json={"path": str(allowed)})
        assert too_many.status_code == 413
        assert "vcm.max_files_per_source" in too_many.json()["error"]["message"]
    async with client(None) as http:  # no settings, no roots: nothing may be mapped
        off = await http.post("/v1/vcm/sources", json={"path": str(allowed)})
        assert off.status_code == 403 and "vcm.allowed_roots is empty" in off.json()["error"]["message"]


# -- the analyze agent --------------------------------------------------------------------------------


async def test_analyze_refuses_a_folder_outside_the_replicas_roots(
    bb: Blackboard, redis_url: str, layout: tuple[Path, Path]
) -> None:
    allowed, outside = layout
    settings = ColonySettings(
        redis_url=redis_url,
        colony_id=f"an{uuid.uuid4().hex[:8]}",
        serve=ServeSettings(monitor_period_seconds=0.1, heartbeat_seconds=0.2),
        vcm=VcmSettings(allowed_roots=[allowed]),
    )
    host = ReplicaHost(settings, "ra", engine=ScriptedEngine(["It defines helpers."]))
    control = ControlPlane(bb, {"ra": host}, settings)
    host.spawner = control.place
    await host.start(bb)
    control.start()
    try:
        await control.place(analyze_blueprint())
        runs = RunService(bb, control.registry, colony_id=settings.colony_id, settings=load_settings())
        outcomes = {}
        for name, path in (("outside", outside), ("dotdot", allowed / ".." / "outside"), ("ok", allowed)):
            submitted = await runs.submit("analyze", {"path": str(path), "page_tokens": 256})
            async with asyncio.timeout(30):
                while (run := await runs.get(submitted.run_id)).status not in ("succeeded", "failed"):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            outcomes[name] = run
        for name in ("outside", "dotdot"):
            assert outcomes[name].status == "failed"
            assert "PathNotAllowed" in outcomes[name].error and "vcm.allowed_roots" in outcomes[name].error
        ok = outcomes["ok"]
        assert ok.status == "succeeded", ok.error
        assert ok.output["files"] == ["main.py", "pkg/util.py"] and not ok.output["partial"]
        assert SECRET not in ok.output["report"]
    finally:
        await control.close()
        await host.close()


def test_unresolvable_and_malformed_paths_are_refused_not_crashed(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a = 1\n")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")  # a file symlink loop inside the tree
    source = PageSource(tmp_path, allowed_roots=[tmp_path])
    assert [p.name for p in source.files()] == ["a.py"] and sorted(source.skipped) == ["loop1", "loop2"]
    for path in (tmp_path / "loop1", "~no-such-user-here/x", "\udcff"):
        with pytest.raises(PathNotAllowed):
            PageSource(path, allowed_roots=[tmp_path])
    with pytest.raises(InvalidArgument, match="NUL"):
        PageSource(f"{tmp_path}/a\0b", allowed_roots=[tmp_path])
