"""Issue 16's acceptance on a real `colony up` with two engine replicas (the embedded model): two
agents on two replicas append to one shared block at the same time and lose nothing; the assistant
keeps what it is told in a core block and answers from it in a later run; blocks of different
agents stay separate across `colony down` and `colony up`.

The appending agents are a user package (on PYTHONPATH, as a user brings one) whose scripted policy
calls the `core_memory_append` tool 50 times: the model's words do not matter there. They ask for
more memory than a replica can give two of them, so placement puts them on different replicas.
"""

from __future__ import annotations

import itertools
import os
import textwrap
import threading
from collections.abc import Iterator

import pytest
from cluster_kit import user_package_cluster

from colony.client import ApiError, ColonyClient
from colony.config import ColonySettings
from colony.serve import cluster
from colony.wire.token import TOKEN_ENV

PACKAGE = "colony_blocks_appender"
LINES = 50
MODULE = textwrap.dedent(
    f'''
    """Agents that append {LINES} lines to the shared block `board` through the block tool."""

    from colony.agents import (
        Agent,
        AgentBlueprint,
        AgentMetadata,
        AgentRunCapability,
        AgentType,
        ScriptedActionPolicy,
    )
    from colony.agents.blueprint import ResourceRequirements
    from colony.memory.blocks.tools import MemoryBlocksCapability
    from colony.system.builtin import RUNS_NAMESPACE


    def appender(agent_id: str) -> AgentBlueprint:
        steps = [
            {{
                "action": "core_memory_append",
                "parameters": {{"label": "board", "content": f"{{agent_id}} line {{i}}"}},
            }}
            for i in range({LINES})
        ]
        return AgentBlueprint(
            agent_class=Agent,
            metadata=AgentMetadata(agent_id=agent_id, agent_type=AgentType.SERVICE, role="appender"),
            capabilities=[
                MemoryBlocksCapability.bind(tool_log=False, include_recall=False),
                AgentRunCapability.bind(namespace=RUNS_NAMESPACE),
            ],
            action_policy=ScriptedActionPolicy.bind(steps=steps),
            resources=ResourceRequirements(memory_mb=1100),
        )
    '''
)


@pytest.fixture(scope="module")
def blocks_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ColonySettings, cluster.ClusterInfo]]:
    with user_package_cluster(
        tmp_path_factory, PACKAGE, MODULE, {"appender-a": "appender", "appender-b": "appender"}
    ) as made:
        yield made


def _client(info: cluster.ClusterInfo) -> ColonyClient:
    return ColonyClient(info.url, info.token, timeout=600)


def test_two_agents_on_two_replicas_append_at_once_and_lose_nothing(blocks_cluster) -> None:
    _settings, info = blocks_cluster
    with _client(info) as client:
        replicas = {a["agent_id"]: a.get("replica") for a in client.agents()}
        assert replicas["appender-a"] and replicas["appender-b"]
        assert replicas["appender-a"] != replicas["appender-b"], replicas
        client.blocks.create("appender-a", "board", block_type="working", char_limit=20_000)
        client.blocks.share("appender-a", "board", "appender-b", "append_only")
        results: dict[str, dict] = {}

        def run(agent: str) -> None:
            with _client(info) as own:
                results[agent] = own.run(agent, {}, timeout_s=600)

        threads = [threading.Thread(target=run, args=(a,)) for a in ("appender-a", "appender-b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(700)
        assert all(r["status"] == "succeeded" for r in results.values()), results
        content = client.blocks.read("appender-a", "board")["content"]
        lines = [line for line in content.split("\n") if line]
        expected = {f"{agent} line {i}" for agent in ("appender-a", "appender-b") for i in range(LINES)}
        assert set(lines) == expected and len(lines) == 2 * LINES
        history = client.blocks.history("appender-a", "board", limit=1000)
        authors = [v["author"] for v in history["versions"] if v["op"] == "append"]
        assert sorted(authors) == ["appender-a"] * LINES + ["appender-b"] * LINES
        switches = sum(1 for x, y in itertools.pairwise(authors) if x != y)
        assert switches >= 2, "the two runs did not append at the same time"
        # appender-b (append-only) may not rewrite the block
        with pytest.raises(ApiError) as refused:
            client.blocks.write("appender-b", "board", "gone")
        assert refused.value.status == 403, refused.value
        assert client.blocks.read("appender-a", "board")["content"] == content


def test_assistant_keeps_a_name_in_a_core_block_and_answers_with_it(blocks_cluster) -> None:
    _settings, info = blocks_cluster
    with _client(info) as client:
        told = client.run("assistant", {"task": "Please remember that my name is Ada."})
        assert told["status"] == "succeeded", told
        human = client.blocks.read("assistant", "human")
        assert "Ada" in human["content"], human
        history = client.blocks.history("assistant", "human")
        assert history["versions"][-1]["author"] == "assistant"
        assert history["versions"][-1]["via"] == "tool"
        asked = client.submit("assistant", {"task": "What is my name?", "emit_prompt": True})["run_id"]
        events = list(client.events(asked))
        view = client.get(asked)
        assert view["status"] == "succeeded", view
        assert "Ada" in view["output"], view["output"]
        prompts = [e["data"]["text"] for e in events if e["event_type"] == "prompt"]
        assert prompts and "<human>" in prompts[0] and "Ada" in prompts[0]


def test_run_show_prompt_prints_each_steps_prompt(blocks_cluster, tmp_path) -> None:
    """`colony run --show-prompt`: the planner's whole prompt of each step on stderr (the text
    input became the task), the answer alone on stdout."""
    from cli_kit import run_cli

    _settings, info = blocks_cluster
    args = ["run", "assistant", "--input", '"What is my name?"', "--show-prompt", "--url", info.url]
    done = run_cli(*args, cwd=tmp_path, env={**os.environ, TOKEN_ENV: info.token or ""})
    assert done.returncode == 0, done.stderr
    assert "prompt of step 0 (" in done.stderr, done.stderr  # with its tokens and budget
    assert "    - Task: What is my name?" in done.stderr, done.stderr
    assert "    <human>" in done.stderr and "## Goals" not in done.stdout
    assert "Ada" in done.stdout


def test_blocks_of_two_agents_stay_separate_across_down_and_up(blocks_cluster) -> None:
    settings, info = blocks_cluster
    with _client(info) as client:
        client.blocks.create("appender-a", "notes", content="A's own notes\n")
        client.blocks.create("appender-b", "notes", content="B's own notes\n")
        client.blocks.append("appender-b", "notes", "B again")
        before = {
            agent: (client.blocks.read(agent, "notes"), client.blocks.history(agent, "notes"))
            for agent in ("appender-a", "appender-b")
        }
        human = client.blocks.read("assistant", "human")["content"]
    assert cluster.down(settings) is True
    info = cluster.up(settings)
    with _client(info) as client:
        for agent, (view, history) in before.items():
            assert client.blocks.read(agent, "notes")["content"] == view["content"]
            assert client.blocks.history(agent, "notes")["versions"] == history["versions"]
        assert client.blocks.read("appender-a", "notes")["content"] == "A's own notes\n"
        assert client.blocks.read("appender-b", "notes")["content"] == "B's own notes\nB again\n"
        assert client.blocks.read("assistant", "human")["content"] == human
        asked = client.run("assistant", {"task": "What is my name?"})
        assert asked["status"] == "succeeded" and "Ada" in asked["output"], asked


def test_down_stops_the_two_replica_cluster(blocks_cluster) -> None:
    settings, _info = blocks_cluster
    assert cluster.down(settings) is True
    assert cluster.status(settings) is None
