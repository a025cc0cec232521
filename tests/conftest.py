"""Shared fixtures: a real redis-server per test session, started through Colony's own EmbeddedRedis."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# one colony secret for the test process and every Ray worker it starts (they inherit the env), so
# blueprints signed in one verify in the other, and no test writes ~/.colony/secret
os.environ.setdefault("COLONY_SECRET", "colony-test-secret-0123456789abcdef")

from colony import security
from colony.blackboard import Blackboard, create_redis
from colony.blackboard.redis_server import EmbeddedRedis, RedisServerInfo
from colony.config import BlackboardSettings, load_settings

# the test session is this process's entry point: it hands the settings over, as `colony` does
security.use_settings(load_settings())


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServerInfo]:
    """A real redis-server on a free port, for the whole session."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis-session"))
    info = server.start()
    yield info
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServerInfo) -> str:
    return redis_server.url


@pytest.fixture
def bb_settings() -> BlackboardSettings:
    return BlackboardSettings()


@pytest.fixture
async def bb(redis_url: str, bb_settings: BlackboardSettings) -> AsyncIterator[Blackboard]:
    """A blackboard on a fresh, unique scope (tests never see each other's keys)."""
    client = create_redis(redis_url, bb_settings)
    board = Blackboard(client, f"test:{uuid.uuid4().hex[:12]}", settings=bb_settings)
    yield board
    await client.aclose()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """An embedded server of a test's own, for tests that stop or kill it."""
    server = EmbeddedRedis(tmp_path / "data")
    yield server
    server.stop()


@pytest.fixture
async def runtime(bb: Blackboard) -> AsyncIterator[object]:
    """A LocalAgentRuntime on its own colony id (tests never see each other's agents)."""
    from colony.agents import LocalAgentRuntime

    rt = LocalAgentRuntime(bb, colony_id=f"c{uuid.uuid4().hex[:10]}", settings=load_settings())
    yield rt
    await rt.shutdown()


@pytest.fixture(scope="session")
def serve_instance() -> Iterator[int]:
    """One local Ray cluster (2 CPUs, no dashboard) with Serve started, for every Serve test; the
    HTTP port of Serve's proxy. Modules deploy their own application on it and delete it after."""
    import ray
    from ray import serve

    from colony.blackboard.redis_server import free_port

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


# The fast tier, `pytest -m "not slow"`, leaves out the tests marked `slow` here: those that start a
# Ray cluster (`colony up`, or a Serve application on `serve_instance`'s Ray), run the embedded model
# (real inference on the CPU), or are otherwise slow: fault injection (tests/chaos/, a Redis of the
# test's own that it stops or kills), in-process replicas that wait on heartbeats or retention, and
# single tests that take seconds. They are found by the fixtures they use, keyed by the file that uses
# them (fixture names repeat across files; "*": this file's), and where a test does it in its own
# body, by the test's name. tests/test_readme_commands.py checks that every name here still exists.
SLOW_FOLDERS = {"chaos"}
SLOW_FIXTURES: dict[str, set[str]] = {
    "*": {"serve_instance", "private_redis"},
    # a Ray cluster: `colony up` (cluster.up) for the module
    "test_cluster.py": {"colony_up"},
    "test_cluster_blocks.py": {"blocks_cluster"},
    "test_cluster_resume.py": {"resume_cluster"},
    "test_cli_chat.py": {"chat_cluster"},
    "test_dashboards_prometheus.py": {"colony_up"},
    "test_console_browser.py": {"colony_up", "browser"},
    "test_upgrade_rehearsal.py": {"cluster", "successor"},
    # the embedded model
    "test_analyze_grounding.py": {"embedded_rig"},
    "test_analyze_openai_engine.py": {"server"},
    "test_context_compaction.py": {"model"},
    "test_inference_embedded.py": {"engine"},
    "test_memory_acceptance.py": {"model"},
    "test_planning_policies.py": {"model"},
    "test_research.py": {"embedded_rig"},
    "test_vcm_needed_soon.py": {"engine"},
    "test_vcm_pinning.py": {"replica", "tiny_host"},
    # in-process replicas waiting on heartbeats, pool growth or run retention
    "test_run_pools.py": {"cluster"},
    "test_run_pools_faults.py": {"cluster"},
    "test_retention.py": {"colony"},
}
SLOW_TESTS: dict[str, set[str]] = {
    # seconds alone: a coordinator crashed and redone, its workers cancelled; a 503 after a wait;
    # a module rewritten with a wrong import and the layering check run on the copy
    "test_research.py": {
        "test_a_step_redone_after_a_crash_spawns_no_worker_twice",
        "test_cancelling_the_run_cancels_its_workers",
    },
    "test_room_on_demand.py": {"test_nothing_to_suspend_is_a_quick_503_with_retry_after"},
    "test_architecture.py": {"test_a_deliberately_wrong_import_is_caught"},
    # seconds of held refusals and waits: the guard's pacing, every route tried without a token
    "test_stranger_pacing.py": {"test_the_api_holds_a_flood_of_wrong_tokens"},
    "test_tenant_quotas.py": {
        "test_a_tenant_that_spent_its_second_is_refused_at_the_door",
        "test_runs_per_second_are_counted_per_tenant_and_not_for_the_colonys_own",
    },
    "test_api_security.py": {"test_every_route_needs_the_token_but_healthz"},
    # 2-3 s each of waits on expiry, retention, a stopped process or a subprocess (the fast tier
    # went over 5 min with the larger research development set)
    "test_memory_acceptance.py": {"test_recall_with_networking_off"},
    "test_api_retention.py": {
        "test_a_retired_run_is_410_retired_then_404_once_forgotten",
        "test_a_run_nobody_answers_expires_after_its_timeout_and_retention",
    },
    "test_doctor_orphans_live.py": {"test_an_ended_agents_memory_is_retained_not_orphaned"},
    "test_context_checkpoints.py": {"test_seven_steps_keep_five_and_undo_replans_from_the_previous_step"},
    "test_cli_chat.py": {
        "test_chat_commands_with_piped_stdin",
        "test_show_prompt_says_what_entered_the_prompt",
    },
    "test_research_quality_bench.py": {
        "test_every_question_names_a_definition_of_its_file_and_the_sets_are_apart"
    },
    "test_indexes.py": {"test_page_table_entries_expire_unless_mapped_held_or_used"},
    "test_session_delete.py": {"test_sessions_idle_past_the_retention_are_deleted"},
    "test_api_idempotency.py": {
        "test_an_effect_keyed_request_whose_process_stopped_is_finished_by_its_retry",
        "test_a_request_whose_process_stopped_is_never_run_again",
    },
    # `colony up` with the embedded model, through the openai package
    "test_openai_door_cluster.py": {
        "test_the_openai_package_talks_to_a_colony_up",
        "test_the_mcp_package_talks_to_a_colony_up",
    },
    # both sandbox suites again, as uid 1000
    "test_sandbox_as_uid1000.py": {"test_the_hostile_program_suites_pass_as_uid_1000"},
    # `colony up` in a subprocess
    "test_paper_cuts.py": {
        "test_up_reports_a_replica_that_cannot_start_and_leaves_nothing",
        "test_up_reports_a_busy_port_and_leaves_nothing",
        "test_up_from_a_folder_maps_it_and_answers_once_on_a_terminal",
    },
    "test_user_agents.py": {
        "test_colony_up_serves_a_user_agent_from_pythonpath_over_http",
        "test_colony_up_with_an_unimportable_user_agent_exits_2_naming_it",
    },
    # the embedded model
    "test_assistant_grounding.py": {
        "test_told_a_name_the_assistant_stores_only_what_was_said",
        "test_what_the_model_writes_itself_is_stored_only_when_the_user_said_it",
    },
    "test_inference_embedded.py": {"test_openai_engine_typed_error_when_server_stopped"},
    "test_memory_consolidation.py": {
        "test_on_the_embedded_model_stm_is_summarised_and_the_skill_lens_reaches_the_planner"
    },
    "test_sessions_tree.py": {"test_a_20000_character_message_gets_a_reply_from_the_real_model"},
    "test_vcm.py": {"test_page_table_follows_real_engine_residency"},
    "test_vcm_pinning.py": {
        "test_generation_pins_its_page_until_it_answers",
        "test_an_abandoned_stream_releases_its_pin",
        "test_analyze_six_pages_on_two_slots_analyses_every_file",
        "test_analyze_workers_bound_to_more_pages_than_slots",
    },
    # otherwise slow: about 3 s or more each (timeouts, process limits, load, waits for expiry)
    "test_api_contract.py": {"test_schemathesis_finds_no_contract_failures"},  # about 30 s
    "test_blackboard_basic.py": {"test_eight_writers_thousand_updates_each"},
    "test_collaborate.py": {
        "test_a_child_whose_replica_dies_is_placed_again_and_the_parent_gets_its_answer",  # about 12 s
    },
    "test_cli_analyze_progress.py": {
        "test_the_progress_line_appears_on_a_terminal",
        "test_a_partial_run_exits_3_and_names_the_files_not_analysed",
    },
    "test_cli_metrics.py": {"test_cli_redis_lifecycle_and_blackboard"},
    "test_event_reader.py": {
        "test_many_subscribers_of_one_stream_share_one_read_and_get_their_own_keys",
        "test_500_idle_agents_share_a_bounded_number_of_connections_and_still_serve",
    },
    "test_memory_capability.py": {
        "test_cap_and_ttl_of_a_scope_hold_for_every_writer",
        "test_ingestion_is_exactly_once_across_suspend_and_resume",
    },
    "test_memory_recall_bench.py": {"test_the_benchmark_prints_every_figure_beside_its_baselines_and_goals"},
    "test_memory_retrieval.py": {"test_a_recall_never_waits_for_a_large_backlog"},
    "test_place_no_wait.py": {"test_place_without_wait_neither_waits_nor_suspends"},
    "test_planning_policies.py": {
        "test_codegen_policy_keeps_its_prompts_under_the_token_budget",
        "test_event_driven_policy_waits_for_events_and_puts_priority_first",
    },
    "test_retention.py": {"test_a_run_with_more_keys_than_one_expiry_call_is_retired_after_its_answer"},
    "test_sandbox.py": {
        "test_a_fork_bomb_hits_the_process_limit_and_dies",
        "test_a_daemonised_grandchild_does_not_survive_the_run",
        "test_the_sandbox_dies_with_colony",
    },
    "test_sandbox_hardening.py": {"test_the_runs_memory_cgroup_bounds_all_its_processes_together"},
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        name = item.path.name
        folders = set(item.path.relative_to(here).parts[:-1]) if item.path.is_relative_to(here) else set()
        fixtures = SLOW_FIXTURES["*"] | SLOW_FIXTURES.get(name, set())
        if (
            SLOW_FOLDERS & folders
            or set(getattr(item, "fixturenames", ())) & fixtures
            or getattr(item, "originalname", item.name) in SLOW_TESTS.get(name, set())
        ):
            item.add_marker(pytest.mark.slow)
