"""A real `colony up` serving a user agent package written by the test (shared by the cluster tests
that need agents of their own: tests/test_cluster_blocks.py, tests/test_cluster_resume.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from colony.blackboard.redis_server import free_port
from colony.config import ColonySettings, ServeSettings
from colony.serve import cluster


@contextmanager
def user_package_cluster(
    tmp_path_factory: pytest.TempPathFactory, package: str, module: str, agents: dict[str, str]
) -> Iterator[tuple[ColonySettings, cluster.ClusterInfo]]:
    """`colony up` with two engine replicas and the user agents `agents` (name -> factory in
    `package.agents`), the package written from `module` onto PYTHONPATH as a user brings one; the
    cluster is brought down and PYTHONPATH put back afterwards."""
    root = tmp_path_factory.mktemp(f"{package}-pkg")
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    (root / package / "agents.py").write_text(module)
    previous = os.environ.get("PYTHONPATH")
    # the daemon, Ray and every replica inherit PYTHONPATH; `up` also checks the factory here
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), previous]))
    sys.path.insert(0, str(root))
    settings = ColonySettings(
        data_dir=tmp_path_factory.mktemp(f"{package}-colony"),
        serve=ServeSettings(
            port=free_port(), num_cpus=2, replicas=2, replica_cpus=0.5, replica_memory_mb=2200
        ),
        agents={name: f"{package}.agents:{factory}" for name, factory in agents.items()},
    )
    info = cluster.up(settings)
    try:
        yield settings, info
    finally:
        cluster.down(settings)
        sys.path.remove(str(root))
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous
