"""Packages that stand alone: the control plane (and its embedded target) import nothing of the lab nor
of the lab's dependencies, the lab talks to the control plane only through its client, and the CLI works
with or without the lab, which adds its own commands."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from dpu_lab.cli import LAB_DEPENDENCIES
from helpers.paths import ROOT

CONTROL = ROOT / "control" / "dpu_limiter"
TARGET = ROOT / "softswitch" / "dpu_softswitch"
LAB = ROOT / "bmv2-lab" / "dpu_lab"
VERIFIER = ROOT / "verifier" / "dpu_verifier"
FIRST_PARTY = {"dpu_limiter", "dpu_softswitch", "dpu_lab", "dpu_verifier"}
# What the verifier may use of the control plane: its client, models and units, as any site's tool would.
# (yamlfile: the one loader of files, with its limits, that the verifier's config goes through; it trusts nothing.)
CONTROL_PUBLIC = {
    "dpu_limiter",
    "dpu_limiter.client",
    "dpu_limiter.models",
    "dpu_limiter.units",
    "dpu_limiter.yamlfile",
}
BMV2_OWN = {"bm_runtime"}  # bmv2's Thrift client, which comes with bmv2 (bmv2_firmware.py finds it)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def imports(folder: Path) -> Iterator[tuple[str, int, str]]:
    """(file, line, module) of every import below `folder`, in functions and TYPE_CHECKING blocks too, and
    of every importlib.import_module / __import__ of a constant name."""
    for path in sorted(folder.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                yield from ((where, node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield where, node.lineno, node.module
            elif isinstance(node, ast.ImportFrom):  # relative: resolved against the file's package
                package = path.relative_to(folder.parent).parts[:-1]
                base = ".".join(package[: len(package) - node.level + 1])
                yield where, node.lineno, f"{base}.{node.module}" if node.module else base
            elif (
                isinstance(node, ast.Call)
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
                in ("import_module", "__import__")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                yield where, node.lineno, node.args[0].value


def top(module: str) -> str:
    return module.partition(".")[0]


def requirement_name(spec: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    name = re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_control_plane_imports_nothing_of_the_lab() -> None:
    found = [
        f"{f}:{line}: {m}"
        for folder, others in (
            (CONTROL, ("dpu_lab", "dpu_verifier", "dpu_softswitch")),
            (TARGET, ("dpu_lab", "dpu_verifier")),
        )
        for f, line, m in imports(folder)
        if top(m) in others or top(m) in LAB_DEPENDENCIES
    ]
    assert not found, (
        "the control plane runs without the lab, the verifier and the embedded target (which adds its own "
        "command), and the target without the lab and the verifier:\n" + "\n".join(found)
    )


def test_the_verifier_uses_only_the_control_planes_public_api() -> None:
    found = [
        f"{f}:{line}: {m}"
        for f, line, m in imports(VERIFIER)
        if top(m) in ("dpu_lab", "dpu_softswitch") or (top(m) == "dpu_limiter" and m not in CONTROL_PUBLIC)
    ]
    assert not found, "the verifier trusts the control plane no further than its API:\n" + "\n".join(found)


def test_the_lab_uses_the_control_plane_through_its_client() -> None:
    protobuf = [f"{f}:{line}: {m}" for f, line, m in imports(LAB) if m.startswith("dpu_limiter._proto")]
    assert not protobuf, "the lab imports the API's messages; use dpu_limiter.client:\n" + "\n".join(protobuf)
    for path in [*sorted(LAB.rglob("*.py")), CONTROL / "cli.py"]:
        stubs = [
            n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute) and n.attr == "stub"
        ]
        assert not stubs, f"{path.relative_to(ROOT)}:{stubs}: calls the generated stub; use LimiterClient's methods"


def installed_modules(requirements: list[str]) -> set[str]:
    """Top-level modules of these distributions (as installed here)."""
    names = {requirement_name(r) for r in requirements}
    return {m for m, dists in metadata.packages_distributions().items() if names & {requirement_name(d) for d in dists}}


def test_each_package_needs_only_what_it_installs() -> None:
    """`pip install .` brings every module the control plane and the target import; `.[lab]` the lab's, and
    `.[cluster]` what the lab's sweeps import only when handed to a cluster, `.[postgres]` what the store
    imports only for a postgresql:// database (and the lab only for replicas on one, --control-db)."""
    core = PYPROJECT["project"]["dependencies"]
    # The lab's own requirements; it also installs the verifier's ("dpu-limiter[verify]").
    lab = [r for r in PYPROJECT["project"]["optional-dependencies"]["lab"] if requirement_name(r) != "dpu-limiter"]
    cluster = PYPROJECT["project"]["optional-dependencies"]["cluster"]
    verify = PYPROJECT["project"]["optional-dependencies"]["verify"]
    postgres = PYPROJECT["project"]["optional-dependencies"]["postgres"]  # store_pg.py, only for postgresql://
    assert {requirement_name(r) for r in lab} == LAB_DEPENDENCIES
    assert not {requirement_name(r) for r in core} & LAB_DEPENDENCIES
    assert "dpu-limiter[lab]" in PYPROJECT["project"]["optional-dependencies"]["test"]  # .ci/run: '.[test]'
    allowed = set(sys.stdlib_module_names) | FIRST_PARTY | BMV2_OWN
    assert "dpu-limiter[verify]" in PYPROJECT["project"]["optional-dependencies"]["test"]
    assert "dpu-limiter[verify]" in PYPROJECT["project"]["optional-dependencies"]["lab"]
    for folders, requirements in (
        ((CONTROL, TARGET), core + postgres),
        ((LAB,), core + verify + lab + cluster + postgres),
        ((VERIFIER,), core + verify),
    ):
        modules = allowed | installed_modules(requirements)
        missing = [f"{f}:{line}: {m}" for d in folders for f, line, m in imports(d) if top(m) not in modules]
        assert not missing, "imported but not a dependency (pyproject.toml):\n" + "\n".join(missing)


def test_the_lab_and_the_verifier_register_their_commands_through_the_entry_point() -> None:
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="dpu_limiter.cli")}
    expected = {
        "lab": "dpu_lab.cli:add_commands",
        "evidence": "dpu_verifier.cli:add_commands",
        "target": "dpu_softswitch.cli:add_commands",
    }
    assert eps == PYPROJECT["project"]["entry-points"]["dpu_limiter.cli"] == expected


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_cli_builds_its_commands_without_the_labs_dependencies() -> None:
    """With the lab installed, building the CLI (`--help`, `serve`, ...) imports none of its dependencies."""
    res = python(
        "import sys\n"
        "from dpu_limiter.cli import _parser\n"
        "_parser()\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in "
        f"{sorted(LAB_DEPENDENCIES)!r} or m.startswith('dpu_lab.') and m != 'dpu_lab.cli'))\n"
    )
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_the_cli_works_without_the_lab() -> None:
    """A control plane installed without the lab: every command but `lab` works."""
    run = "import sys; sys.modules['dpu_lab'] = None; from dpu_limiter.cli import main; sys.exit(main({}))"
    res = python(run.format(["--help"]))
    assert res.returncode == 0 and "serve" in res.stdout and " lab " not in res.stdout, res.stdout
    assert "dpu_lab.cli:add_commands" in res.stderr  # said, not hidden
    assert python(run.format(["serve", "--help"])).returncode == 0
    res = python(run.format(["lab", "run", "x.yaml", "--out", "o"]))
    assert res.returncode == 2 and "invalid choice: 'lab'" in res.stderr


def test_the_lab_without_its_dependencies_says_what_to_install(tmp_path: Path) -> None:
    """`pip install .` without the `lab` extra: `lab run` says what to install, and starts nothing."""
    scenario = ROOT / "bmv2-lab" / "scenarios" / "two-pods.yaml"
    res = python(
        f"import sys; sys.modules.update(dict.fromkeys({sorted(LAB_DEPENDENCIES)!r}))\n"
        "from dpu_limiter.cli import main\n"
        f"sys.exit(main(['lab', 'run', {str(scenario)!r}, '--out', {str(tmp_path / 'o')!r}, '--time', 'virtual']))\n"
    )
    assert res.returncode == 2, res.stderr
    assert "the lab needs" in res.stderr and "pip install 'dpu-limiter[lab]'" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "o").exists()
