"""The web console (issue 38) in a real browser: headless Chromium (the Debian package) driven by
Playwright's Python package pointed at that binary (no browser download), against a real
`colony up` cluster. Logs in, watches the colony and a run stream to completion, shows a block
holding markup as text, and checks the Content-Security-Policy and where the token is kept.
Screenshots of each view go to $CONSOLE_SCREENSHOTS (default: the test's temporary folder)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from colony.blackboard.redis_server import free_port
from colony.client import ColonyClient
from colony.config import ApiSettings, ColonySettings, ServeSettings
from colony.serve import cluster

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
METRICS_TOKEN = "metrics-only-token-for-the-console-test"
HOSTILE = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'


@pytest.fixture(scope="module")
def colony_up(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ColonySettings, cluster.ClusterInfo]]:
    settings = ColonySettings(
        data_dir=tmp_path_factory.mktemp("console-up"),
        serve=ServeSettings(port=free_port(), num_cpus=2, replica_cpus=0.5),
        api=ApiSettings(metrics_token=METRICS_TOKEN),
    )
    info = cluster.up(settings)
    yield settings, info
    cluster.down(settings)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("CONSOLE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def new_page(browser: Any) -> Page:
    """A page that fails the test on a script error or a console error (a CSP violation included)."""
    page = browser.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "console",
        lambda message: problems.append(f"console: {message.text}") if message.type == "error" else None,
    )
    page.problems = problems  # type: ignore[attr-defined]
    return page


def no_problems(page: Page, *, refused_login: bool = False) -> None:
    """No script or console error on the page (`refused_login`: but the 401 of a wrong token the
    test typed on purpose, which the browser logs as a failed request)."""
    left = [p for p in page.problems if not (refused_login and "401" in p)]  # type: ignore[attr-defined]
    assert not left, left


def logged_in(browser: Any, info: cluster.ClusterInfo) -> Page:
    page = new_page(browser)
    response = page.goto(f"{info.url}/ui")
    assert response is not None and response.ok
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    page.fill("#token", info.token)
    page.click("#login button[type=submit]")
    expect(page.locator("#states")).to_contain_text("all:")
    return page


def test_log_in_and_see_the_colony(colony_up: Any, browser: Any, shots: Path) -> None:
    _, info = colony_up
    page = new_page(browser)
    page.goto(f"{info.url}/ui/")
    page.fill("#token", "not-the-token")
    page.click("#login button[type=submit]")
    expect(page.locator("#login .error")).to_contain_text("not accepted")
    page.screenshot(path=str(shots / "console-login.png"))
    no_problems(page, refused_login=True)
    page = logged_in(browser, info)
    expect(page.locator("#replicas tbody tr").first).to_be_visible()
    cells = page.locator("#replicas tbody tr").first.locator("td")
    expect(cells.nth(2)).to_contain_text(" of ")  # agents hosted of the replica's room
    expect(cells.nth(5)).to_have_text("0")  # page faults (a count, not a blank)
    expect(page.locator("#agents")).to_contain_text("echo")
    expect(page.locator("#waiting")).to_contain_text("No agent waits for a condition")
    expect(page.locator("#pages")).to_contain_text("page(s) mapped")
    expect(page.locator("main")).not_to_contain_text("null")
    page.screenshot(path=str(shots / "console-colony.png"), full_page=True)
    # the token is in this tab's session storage only: not in the URL, not in a cookie
    assert page.evaluate("sessionStorage.getItem('colony.token')") == info.token
    assert info.token not in page.url and page.context.cookies() == []
    page.click("#logout")
    expect(page.locator("#login")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('colony.token')") is None
    calls: list[str] = []
    page.on("request", lambda request: calls.append(request.url) if "/v1/" in request.url else None)
    page.wait_for_timeout(4000)  # longer than the colony view's refresh: logged out, it stopped
    assert calls == []
    no_problems(page)


def test_a_run_streams_to_completion(colony_up: Any, browser: Any, shots: Path) -> None:
    _, info = colony_up
    page = logged_in(browser, info)
    page.click("text=Start a run")
    page.fill("#agent", "ask")
    page.fill("#input", '{"question": "What is the capital of France?"}')
    page.click("#submit button[type=submit]")
    expect(page.locator("#status")).to_contain_text("succeeded", timeout=180_000)
    expect(page.locator("#events")).to_contain_text("completed")
    # each step's timing (from the step events' spans) and the run's tree with where it ran
    expect(page.locator("#steps tbody tr").first).to_contain_text(" ms")
    expect(page.locator("#tree")).to_contain_text("ask")
    expect(page.locator("#tree")).to_contain_text(" · on ")
    answer = page.locator("#answer").inner_text()
    run_id = page.url.rsplit("/", 1)[-1]
    with ColonyClient(info.url, info.token) as client:
        assert client.get(run_id)["output"] == answer.strip()  # the streamed text is the run's output
    page.screenshot(path=str(shots / "console-run.png"), full_page=True)
    no_problems(page)


def test_a_block_holding_markup_is_shown_as_text(colony_up: Any, browser: Any, shots: Path) -> None:
    _, info = colony_up
    with ColonyClient(info.url, info.token) as client:
        client.blocks.create("assistant", "hostile", content=HOSTILE)
    page = logged_in(browser, info)
    page.goto(f"{info.url}/ui/#/agents/assistant")
    expect(page.locator("#blocks")).to_contain_text(HOSTILE)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#blocks img").count() == 0 and page.locator("#blocks script").count() == 0
    expect(page.locator("main")).not_to_contain_text("null")
    page.screenshot(path=str(shots / "console-agent.png"), full_page=True)
    no_problems(page)


def test_console_files_need_no_token_and_the_api_still_does(colony_up: Any) -> None:
    import httpx

    _, info = colony_up
    assert httpx.get(f"{info.url}/ui/app.js").status_code == 200
    assert httpx.get(f"{info.url}/ui/nothing.js").status_code == 404
    assert httpx.post(f"{info.url}/ui/").status_code == 401  # only reads are open
    assert httpx.get(f"{info.url}/v1/agents").status_code == 401


def test_prompts_of_each_step_then_undo_a_checkpoint_after_confirming(
    colony_up: Any, browser: Any, shots: Path
) -> None:
    _, info = colony_up
    page = logged_in(browser, info)
    page.click("text=Start a run")
    page.fill("#agent", "assistant")
    page.fill("#input", '{"task": "Remember that my cat is called Tom."}')
    page.check("#emit-prompt")  # as `colony run --show-prompt`
    page.click("#submit button[type=submit]")
    expect(page.locator("#status")).to_contain_text("succeeded", timeout=300_000)
    expect(page.locator("#prompts details").first).to_be_visible()
    page.locator("#prompts details summary").first.click()
    expect(page.locator("#prompts details pre").first).to_contain_text("my cat is called Tom")
    page.screenshot(path=str(shots / "console-prompts.png"), full_page=True)
    with ColonyClient(info.url, info.token, timeout=300) as client:
        before = client.context.checkpoints("assistant")
    assert len(before) >= 2
    page.goto(f"{info.url}/ui/#/agents/assistant")
    expect(page.locator("#checkpoints tbody tr")).to_have_count(len(before))
    page.once("dialog", lambda dialog: dialog.dismiss())  # asked first; "no" changes nothing
    page.click("#undo")
    expect(page.locator("#undo-report")).to_have_count(0)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#undo")
    expect(page.locator("#undo-report")).to_contain_text("not_undone")
    # back at the checkpoint before the newest (the agent may then run the discarded step again)
    expect(page.locator("#undo-report")).to_contain_text(f'"step": {before[-2]["step"]},')
    expect(page.locator("#undo-report")).to_contain_text(f'"discarded": [\n    {before[-1]["step"]}\n  ]')
    page.screenshot(path=str(shots / "console-undo.png"), full_page=True)
    no_problems(page)


def test_a_blocks_history_diff_and_rollback(colony_up: Any, browser: Any, shots: Path) -> None:
    _, info = colony_up
    with ColonyClient(info.url, info.token) as client:
        client.blocks.create("echo", "notes", content="first line\nsecond line")
        client.blocks.append("echo", "notes", "third line")
    page = logged_in(browser, info)
    page.goto(f"{info.url}/ui/#/agents/echo")
    page.click("#blocks a:text-is('notes')")
    expect(page.locator("#content")).to_contain_text("third line")
    expect(page.locator("table tbody tr")).to_have_count(2)  # created, appended
    expect(page.locator("#diff .added")).to_contain_text("+ third line")
    expect(page.locator("#diff .removed")).to_have_count(0)
    page.screenshot(path=str(shots / "console-block.png"), full_page=True)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#rollback")
    expect(page.locator("#rollback-report")).to_contain_text('"version": 3')
    with ColonyClient(info.url, info.token) as client:
        first = client.blocks.read("echo", "notes", version=1)["content"]
        assert client.blocks.read("echo", "notes")["content"] == first and "third" not in first
    page.once("dialog", lambda dialog: dialog.dismiss())  # asked first; "no" changes nothing
    page.click("#undo-edit")
    expect(page.locator("#undo-edit-report")).to_have_count(0)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#undo-edit")  # the rollback was echo's latest edit: undone, "third line" is back
    expect(page.locator("#undo-edit-report")).to_contain_text('"version": 4')
    with ColonyClient(info.url, info.token) as client:
        assert "third line" in client.blocks.read("echo", "notes")["content"]
    no_problems(page)


def test_chat_two_turns_and_go_back(colony_up: Any, browser: Any, shots: Path) -> None:
    _, info = colony_up
    page = logged_in(browser, info)
    page.click("text=Chat")
    page.click("#new-session")
    expect(page.locator("#chat")).to_be_visible(timeout=60_000)
    for message in ("Hello, my name is Dana.", "What is two plus two?"):
        page.fill("#message", message)
        page.click("#chat button[type=submit]")
        expect(page.locator("#messages .message.user").last).to_contain_text(message, timeout=180_000)
        expect(
            page.locator("#messages .message.assistant").nth(
                page.locator("#messages .message.user").count() - 1
            )
        ).to_be_visible(timeout=180_000)
    expect(page.locator("#messages .message")).to_have_count(4)
    page.screenshot(path=str(shots / "console-chat.png"), full_page=True)
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#messages .message .revert").nth(1).click()  # back to the first reply
    expect(page.locator("#messages .message")).to_have_count(2)
    expect(page.locator("#messages")).not_to_contain_text("two plus two")
    # the whole tree keeps the reverted turn, off the active branch
    expect(page.locator("#conversation-tree")).to_contain_text("two plus two")
    expect(page.locator("#conversation-tree .on-branch")).to_have_count(2)
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#messages .message .fork").nth(0).click()  # a new branch from the first message
    expect(page.locator("#branch option")).to_have_count(2)
    expect(page.locator("#messages .message")).to_have_count(1)
    expect(page.locator("#branch")).to_have_value("fork-1")
    page.screenshot(path=str(shots / "console-chat-tree.png"), full_page=True)
    no_problems(page)


def test_memory_map_and_recall_with_scores(colony_up: Any, browser: Any, shots: Path) -> None:
    _, info = colony_up
    with ColonyClient(info.url, info.token) as client:
        client.memory.write("assistant", "working", "The staging database moved to port 6543.", tags=["ops"])
    page = logged_in(browser, info)
    page.goto(f"{info.url}/ui/#/agents/assistant")
    page.click("#memory-link")
    expect(page.locator("main table").first).to_contain_text("working")
    expect(page.locator("#dataflow")).to_contain_text("→")
    # the map drawn: a box per scope, an arrow per dataflow edge (SVG built as text nodes)
    expect(page.locator("#memory-graph .scope-node[data-scope=working]")).to_have_count(1)
    assert page.locator("#memory-graph .edge").count() == page.locator("#dataflow li").count()
    page.fill("#query", "Which port does the staging database use?")
    page.fill("#tag", "ops")
    page.click("#recall button[type=submit]")
    expect(page.locator("#recalled")).to_contain_text("6543")
    expect(page.locator("#recalled")).to_contain_text("vector")  # each result's scores
    page.screenshot(path=str(shots / "console-memory.png"), full_page=True)
    no_problems(page)


def test_an_agents_profile_runs_restore_and_export(colony_up: Any, browser: Any, shots: Path) -> None:
    import json

    _, info = colony_up
    with ColonyClient(info.url, info.token, timeout=120) as client:
        runs = [client.run("echo", {"message": f"hello {n}"})["run_id"] for n in range(2)]
        kept = client.context.checkpoints("echo")
    page = logged_in(browser, info)
    page.goto(f"{info.url}/ui/#/agents/echo")
    expect(page.locator("#profile")).to_contain_text("colony.")  # its class, policy, capabilities
    expect(page.locator("#profile")).to_contain_text("Actions")
    expect(page.locator("#runs tbody tr").first).to_contain_text(runs[-1])  # newest first
    expect(page.locator("#runs")).to_contain_text(runs[0])
    page.screenshot(path=str(shots / "console-agent-profile.png"), full_page=True)
    expect(page.locator("#checkpoints tbody tr")).to_have_count(len(kept))
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("#restore-0")
    expect(page.locator("#restore-report")).to_have_count(0)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#restore-0")  # back to the oldest kept checkpoint
    expect(page.locator("#restore-report")).to_contain_text(f'"step": {kept[0]["step"]},')
    with page.expect_download() as download:
        page.click("#export-button")
    document = json.loads(Path(download.value.path()).read_text())
    assert document["format"] == "colony-agent-export" and document["agent_id"] == "echo"
    expect(page.locator("#export-link")).to_contain_text("echo.colony-agent.json")
    no_problems(page)


def test_the_resumption_queue_in_the_monitors_order(colony_up: Any, browser: Any) -> None:
    _, info = colony_up
    with ColonyClient(info.url, info.token) as client:
        client.suspend("assistant")  # waits for a resume (custom): queued until then
        try:
            page = logged_in(browser, info)
            expect(page.locator("#waiting tbody tr")).to_have_count(1)
            expect(page.locator("#waiting tbody tr").first).to_contain_text("assistant")
            expect(page.locator("#waiting tbody tr").first).to_contain_text("custom")
            no_problems(page)
        finally:
            client.resume("assistant")


def test_read_only_with_the_metrics_token(colony_up: Any, browser: Any, shots: Path) -> None:
    _, info = colony_up
    page = new_page(browser)
    calls: list[str] = []
    page.on("request", lambda request: calls.append(request.url) if "/v1/" in request.url else None)
    page.goto(f"{info.url}/ui/#/agents/echo")
    page.fill("#token", METRICS_TOKEN)
    page.click("#login button[type=submit]")
    expect(page.locator("#read-only")).to_be_visible()
    expect(page.locator("#states")).to_contain_text("idle:")  # agents by state, from /metrics
    expect(page.locator("#replicas tbody tr").first).to_be_visible()
    expect(page.locator("nav")).not_to_contain_text("Start a run")
    expect(page.locator("#runs")).to_contain_text("succeeded:")  # the cluster's run counts
    expect(page.locator("#http")).to_contain_text("200:")
    page.goto(f"{info.url}/ui/#/run")  # any page: the read-only view (the token opens nothing else)
    expect(page.locator("#read-only")).to_be_visible()
    expect(page.locator("#submit")).to_have_count(0)
    page.screenshot(path=str(shots / "console-metrics.png"), full_page=True)
    assert calls == [f"{info.url}/v1/token"]  # the login's probe (401), nothing after
    no_problems(page, refused_login=True)


def test_a_scoped_token_sees_what_it_may_do(colony_up: Any, browser: Any, shots: Path) -> None:
    _, info = colony_up
    with ColonyClient(info.url, info.token) as client:
        reader = client.access.create_token(["read"], note="console test")
    page = new_page(browser)
    page.goto(f"{info.url}/ui/")
    page.fill("#token", reader["token"])
    page.click("#login button[type=submit]")
    expect(page.locator("#who")).to_contain_text(f"token {reader['id']} · tenant default · read")
    expect(page.locator("#agents")).to_contain_text("echo")  # it reads
    expect(page.locator("nav a:text-is('Start a run')")).to_be_hidden()  # it may not run
    page.goto(f"{info.url}/ui/#/agents/echo")
    expect(page.locator("#profile")).to_contain_text("Actions")
    expect(page.locator("#export-button")).to_be_hidden()  # export and undo need admin
    page.screenshot(path=str(shots / "console-scoped-token.png"), full_page=True)
    no_problems(page)
