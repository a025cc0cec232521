"""The hostile-program suites (tests/test_sandbox.py, tests/test_sandbox_hardening.py) run again as
uid 1000, the uid the shipped images run Colony as (issue 39, deliverable 5): bubblewrap in a user
namespace of its own, no uid switch and no cgroup (neither can be made without root), so what
bounds a run is the seccomp allowlist (one process: no fork, thread or file), the rlimits (CPU,
address space, file size, descriptors, locked memory), the read-only root and the capped scratch
tmpfs, and the wall-clock kill. Every test of the suites passes there, but those about what only
root can do (a uid per run, its process limit, cgroups), which are skipped with that reason.

The CI machine runs the tests as root; tests/uid_view.py drops to uid 1000 in a mount namespace in
which the interpreter under /root is reachable (nothing outside it changes)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
UID = 1000
SUITES = ["tests/test_sandbox.py", "tests/test_sandbox_hardening.py"]
ROOT_ONLY = {  # the tests of what only root can do: skipped as uid 1000, each saying why
    "test_program_runs_as_a_fresh_unprivileged_uid_when_colony_is_root",
    "test_a_fork_bomb_hits_the_process_limit_and_dies[bubblewrap]",
    "test_a_fork_bomb_hits_the_process_limit_and_dies[process]",
    "test_the_runs_memory_cgroup_bounds_all_its_processes_together[bubblewrap]",
    "test_the_runs_memory_cgroup_bounds_all_its_processes_together[process]",
    "test_every_run_has_its_own_cgroup_with_memory_and_pids_limits",
    "test_cgroups_left_by_a_colony_that_died_are_removed",
    "test_a_uid_range_meeting_subuid_ranges_is_refused",
    "test_a_uid_some_process_already_runs_as_is_never_drawn_nor_swept",
}
RUN_AS_1000 = {  # what must run there: the runaways, the escapes, the allowlist, bubblewrap's view
    "test_escapes_and_runaways_are_stopped_with_a_clear_error[infinite loop]",
    "test_escapes_and_runaways_are_stopped_with_a_clear_error[4 GB]",
    "test_files_outside_the_runtime_and_the_scratch_tmpfs_are_invisible",
    "test_no_network_even_to_localhost",
    "test_a_daemonised_grandchild_does_not_survive_the_run[bubblewrap]",
    "test_a_daemonised_grandchild_does_not_survive_the_run[process]",
    "test_the_seccomp_allowlist_refuses_everything_but_the_allowed_work[bubblewrap]",
    "test_the_seccomp_allowlist_refuses_everything_but_the_allowed_work[process]",
    "test_required_cgroups_refuse_to_run_where_they_cannot_be_made",
    "test_without_cgroups_file_descriptors_and_locked_memory_are_bounded",
    "test_the_scratch_tmpfs_is_capped",
    "test_wall_clock_limit_stops_a_sleeping_program",
}


def test_the_hostile_program_suites_pass_as_uid_1000() -> None:
    assert os.geteuid() == 0, "run as root (as the CI does): the test drops to uid 1000 itself"
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o777)  # (uid 1000 writes the report there)
        report = Path(folder) / "report.xml"
        command = [
            "unshare", "--mount", "--",
            sys.executable, str(HERE / "uid_view.py"), str(UID), "--",
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            f"--junitxml={report}", *SUITES,
        ]  # fmt: skip
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert report.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
        cases = ET.parse(report).getroot().iter("testcase")
        outcome = {case.get("name", ""): _outcome(case) for case in cases}
    failed = {name: what for name, what in outcome.items() if what not in ("passed", "skipped")}
    assert not failed and done.returncode == 0, (failed, done.stdout[-3000:])
    skipped = {name for name, what in outcome.items() if what == "skipped"}
    assert skipped == ROOT_ONLY, skipped ^ ROOT_ONLY
    passed = {name for name, what in outcome.items() if what == "passed"}
    assert passed >= RUN_AS_1000, RUN_AS_1000 - passed
    assert len(outcome) >= 80  # the whole of both suites ran


def _outcome(case: ET.Element) -> str:
    for kind in ("failure", "error", "skipped"):
        found = case.find(kind)
        if found is not None:
            return kind if kind != "skipped" else "skipped"
    return "passed"


def test_the_uid_view_refuses_outside_a_mount_namespace_of_its_own() -> None:
    """Run in the host's mount namespace it would cover the host's /root: it refuses instead."""
    usage = subprocess.run(
        [sys.executable, str(HERE / "uid_view.py"), "1000", "--"], capture_output=True, text=True
    )
    assert usage.returncode == 2 and "usage" in usage.stderr
    here = subprocess.run(
        [sys.executable, str(HERE / "uid_view.py"), "1000", "--", "true"], capture_output=True, text=True
    )
    assert here.returncode == 2 and "mount namespace of its own" in here.stderr
    assert oct(os.stat("/root").st_mode & 0o777) != "0o755" or os.path.ismount("/root") is False
