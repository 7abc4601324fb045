"""Hostile YAML files: duplicate keys, deep nesting, alias bombs, endless or huge or undecodable files.

Each is refused by `dpu_limiter.yamlfile.read_yaml` (the one loader of manifests, lab topologies, scenarios
and sweeps) with a short error naming the file and where in it, directly and through `dpu-limiter apply -f`,
which then leaves what the control plane stores as it was. Loads that would blow up memory without the
limits run in a child process whose data segment is capped, so a regression fails instead of eating RAM.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from dpu_limiter import yamlfile
from dpu_limiter.manifest import ManifestError, load_manifest
from dpu_limiter.yamlfile import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES, YamlFileError, read_yaml
from helpers.paths import ROOT
from helpers.processes import free_port, stop, wait_port

MANIFEST = """\
pods:
  - {name: a, ipv4_prefixes: [10.0.1.0/24]}
  - {name: b, ipv4_prefixes: [10.0.2.0/24]}
caps:
  - {pod: a, egress: 1G, ingress: 1G, window_s: 60}
"""

MB = 1_000_000
SHORT = 1000  # an error message (or the CLI's whole stderr) stays under this many characters
DATA_LIMIT = 1 << 30  # a child's data segment: a missing limit fails with MemoryError, not an OOM


def _limited(command: list[str]) -> list[str]:
    """`command` with its data segment capped, by prlimit(1): a Python preexec_fn forks this process, whose gRPC
    (from earlier tests) then wrote an error of its own poller to the child's stderr now and then."""
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed: it caps the child's memory")
    return ["prlimit", f"--data={DATA_LIMIT}", *command]


def bomb() -> str:
    """The billion laughs (10^9 strings once expanded) as a pod's name: about 400 bytes on disk."""
    levels = ["&0 [lol,lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    levels += [f"&{i} [{','.join([f'*{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "pods:\n- ipv4_prefixes: [10.0.1.0/24]\n  name: [" + ",\n".join(levels) + "]\n"


def merge_chain(n: int) -> str:
    """Mappings each merging the one before (`<<`): n levels deep once the merges are followed."""
    lines = ["pods:", "  - {name: a, ipv4_prefixes: [10.0.1.0/24]}", "name:", "  - &m0 {k0: 0}"]
    lines += [f"  - &m{i} {{<<: *m{i - 1}, k{i}: {i}}}" for i in range(1, n)]
    return "\n".join(lines) + "\n"


@pytest.fixture(params=["c", "python"] if yamlfile.CLoader is not None else ["python"])
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both parsers the loader runs on: libyaml's where PyYAML has it, PyYAML's own otherwise."""
    if request.param == "python":
        monkeypatch.setattr(yamlfile, "CLoader", None)
    return str(request.param)


def refused(path: Path) -> str:
    """load_manifest's error for the file, checked to be short and to name it."""
    with pytest.raises(ManifestError) as err:
        load_manifest(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:") and len(msg) < SHORT, msg[:SHORT]
    return msg


def refused_in_child(path: Path, loader: str) -> str:
    """The same, in a child process with a capped data segment (for files that would blow up memory)."""
    code = (
        "import sys; from pathlib import Path; from dpu_limiter import yamlfile\n"
        "from dpu_limiter.manifest import ManifestError, load_manifest\n"
        "if sys.argv[2] == 'python':\n    yamlfile.CLoader = None\n"
        "try:\n    load_manifest(Path(sys.argv[1]))\nexcept ManifestError as e:\n    print(e)\n"
    )
    command = _limited([sys.executable, "-c", code, str(path), loader])
    res = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and not res.stderr, res.stderr[-SHORT:]
    msg = res.stdout.strip()
    assert msg.startswith(f"{path}:") and len(msg) < SHORT, msg[:SHORT]
    return msg


def test_a_duplicate_key_in_a_cap_entry_is_refused_naming_both_lines(tmp_path: Path, loader: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST.replace("window_s: 60}", "window_s: 60, egress: 1k}"))
    assert refused(f) == f"{f}:5:53: duplicate key 'egress' (first at line 5)"
    f.write_text(MANIFEST + "  - pod: b\n    egress: 1G\n    ingress: 1G\n    window_s: 60\n    egress: 1k\n")
    assert refused(f) == f"{f}:10:5: duplicate key 'egress' (first at line 7)"


def test_a_second_top_level_pods_is_refused(tmp_path: Path, loader: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST + "pods:\n  - {name: c, ipv4_prefixes: [10.0.3.0/24]}\n")
    assert refused(f) == f"{f}:6:1: duplicate key 'pods' (first at line 1)"


def test_keys_equal_once_read_are_duplicates_and_merged_keys_are_not(tmp_path: Path, loader: str) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("{1: a, 0x1: b}")
    assert "duplicate key 1 (first at line 1)" in refused(f)
    f.write_text("base: &b {k: 1, j: 2}\nover: {<<: *b, k: 3}\n")  # an explicit key overrides a merged one
    assert read_yaml(f) == {"base": {"k": 1, "j": 2}, "over": {"k": 3, "j": 2}}


@pytest.mark.parametrize("opener", ["[", "{a: ", "- "])
def test_deep_nesting_is_refused_by_depth_not_by_recursion_error(tmp_path: Path, loader: str, opener: str) -> None:
    f = tmp_path / "deep.yaml"
    f.write_text(opener * 10_000)
    msg = refused(f)  # libyaml stops a flow at 1000 levels while it scans ahead: then the place is there
    assert re.fullmatch(rf"{re.escape(str(f))}:1:\d+: nested deeper than {MAX_DEPTH} levels.*", msg), msg
    f.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)  # the limit itself is allowed
    assert read_yaml(f) is not None


def test_the_billion_laughs_is_refused_before_it_grows(tmp_path: Path, loader: str) -> None:
    f = tmp_path / "bomb.yaml"
    f.write_text(bomb())
    assert f.stat().st_size < 500
    msg = refused_in_child(f, loader)
    assert re.fullmatch(rf"{re.escape(str(f))}:\d+:\d+: more than {MAX_NODES} nodes once aliases are expanded", msg)


def test_alias_limits(tmp_path: Path, loader: str) -> None:
    f = tmp_path / "a.yaml"
    f.write_text(merge_chain(MAX_DEPTH + 10))  # merges nest what they repeat: bounded by depth too
    assert f"nested deeper than {MAX_DEPTH} levels" in refused(f)
    f.write_text("name: &a [x, *a]\n")
    assert refused(f) == f"{f}:1:14: alias *a inside the node it names"
    f.write_text("a: &a [x, y]\nb: [*a, *a]\n")  # plain aliases stay what they are
    assert read_yaml(f) == {"a": ["x", "y"], "b": [["x", "y"], ["x", "y"]]}
    f.write_text(merge_chain(10))
    assert read_yaml(f)["name"][9] == {f"k{i}": i for i in range(10)}


def test_dev_zero_stops_at_the_size_limit(loader: str) -> None:
    msg = refused_in_child(Path("/dev/zero"), loader)
    assert msg == f"/dev/zero: larger than {MAX_FILE_BYTES} bytes (16 MiB); not read further"


def test_a_20_mib_file_is_refused_unparsed(tmp_path: Path, loader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "big.yaml"
    with f.open("w") as out:
        out.write(MANIFEST + "# " + "x" * (20 * 2**20) + "\n")
    assert refused(f) == f"{f}: larger than {MAX_FILE_BYTES} bytes (16 MiB); not read further"
    f.write_text(MANIFEST)
    monkeypatch.setattr(yamlfile, "MAX_FILE_BYTES", len(MANIFEST))  # exactly the limit: read
    assert len(load_manifest(f).pods) == 2
    monkeypatch.setattr(yamlfile, "MAX_FILE_BYTES", len(MANIFEST) - 1)
    assert refused(f) == f"{f}: larger than {len(MANIFEST) - 1} bytes; not read further"


def test_an_undecodable_file_names_the_file_and_where(tmp_path: Path, loader: str) -> None:
    f = tmp_path / "latin1.yaml"
    f.write_bytes(MANIFEST.encode() + b"name: caf\xe9\n")
    assert refused(f) == f"{f}:6: not UTF-8: byte 0xe9 at offset {len(MANIFEST) + 9} (invalid continuation byte)"
    f.write_bytes(MANIFEST.encode() + b"name: ok\x00\n")  # decodable but not YAML: placed too
    assert refused(f).startswith(f"{f}:6:9: not valid YAML: unacceptable character #x0000")


HUGE = "x" * MB


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        (MANIFEST.replace("name: a,", f"name: {HUGE},"), "pods[0].name"),
        (MANIFEST.replace("caps:", f"  - name: c\n    ipv4_prefixes: []\n    ? {HUGE}\n    : 1\ncaps:"), "pods[2].xxx"),
        (MANIFEST + f"? {HUGE}\n: 1\n", "unknown keys"),
        (MANIFEST + f"? {HUGE}\n: 1\n? {HUGE}\n: 2\n", "duplicate key 'xxxx"),
        (MANIFEST + f"name: *{HUGE}\n", "undefined alias"),
        (MANIFEST + f"name: !{HUGE} x\n", "could not determine a constructor"),
        (MANIFEST + f"name: {'1' * MB}\n", "integer of 1000000 characters"),
        (MANIFEST + f'name: "{HUGE}\n', "not valid YAML"),
    ],
    ids=["value", "key", "top-key", "duplicate", "alias", "tag", "integer", "unclosed"],
)
def test_a_megabyte_value_keeps_the_error_short(tmp_path: Path, text: str, expect: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(text)
    assert expect in refused(f)


def test_every_yaml_file_shipped_reads_as_pyyaml_reads_it(loader: str) -> None:
    files = sorted(ROOT.glob("bmv2-lab/**/*.yaml"))
    assert len(files) > 10
    for f in files:
        assert read_yaml(f) == yaml.safe_load(f.read_text()), f


def test_a_directory_or_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(YamlFileError, match=f"^{re.escape(str(tmp_path))}: cannot read: Is a directory$"):
        read_yaml(tmp_path)
    with pytest.raises(YamlFileError, match="missing.yaml: cannot read: No such file or directory$"):
        read_yaml(tmp_path / "missing.yaml")


# --- the same through `dpu-limiter apply -f`, against a running control plane ---


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`dpu-limiter ARGS` with a capped data segment, so a loader that blows up fails instead of eating RAM."""
    command = _limited([sys.executable, "-m", "dpu_limiter.cli", *args])
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def stored(server: str) -> dict[str, object]:
    return {kind: json.loads(run_cli("get", kind, "--json", "--server", server).stdout) for kind in ("pods", "caps")}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, object]]]:
    """A control plane holding MANIFEST, and what it stores."""
    tmp = tmp_path_factory.mktemp("served")
    port = free_port()
    command = [sys.executable, "-m", "dpu_limiter.cli", "serve", "--db", str(tmp / "s.db")]
    proc = subprocess.Popen(
        [*command, "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_port(port, proc)
        server = f"127.0.0.1:{port}"
        (tmp / "m.yaml").write_text(MANIFEST)
        assert run_cli("apply", "-f", str(tmp / "m.yaml"), "--server", server).returncode == 0
        yield server, stored(server)
    finally:
        stop(proc)


def _file(text: str) -> Callable[[Path], Path]:
    def write(tmp: Path) -> Path:
        (tmp / "m.yaml").write_text(text)
        return tmp / "m.yaml"

    return write


def _big(tmp: Path) -> Path:
    with (tmp / "big.yaml").open("w") as out:
        out.write(MANIFEST + "# " + "x" * (20 * 2**20) + "\n")
    return tmp / "big.yaml"


def _latin1(tmp: Path) -> Path:
    (tmp / "latin1.yaml").write_bytes(MANIFEST.encode() + b"name: caf\xe9\n")
    return tmp / "latin1.yaml"


@pytest.mark.parametrize(
    ("make", "code", "expect"),
    [
        (_file(MANIFEST.replace("window_s: 60}", "window_s: 60, egress: 1k}")), 2, ":5:53: duplicate key 'egress'"),
        (_file(MANIFEST + "pods:\n  - {name: c, ipv4_prefixes: [10.0.3.0/24]}\n"), 2, ":6:1: duplicate key 'pods'"),
        (_file("- " * 10_000), 2, f":1:{2 * MAX_DEPTH + 1}: nested deeper than {MAX_DEPTH} levels"),
        (_file(bomb()), 2, "nodes once aliases are expanded"),
        (lambda tmp: Path("/dev/zero"), 2, ": larger than 16777216 bytes (16 MiB)"),
        (_big, 2, ": larger than 16777216 bytes (16 MiB)"),
        (_latin1, 2, ":6: not UTF-8: byte 0xe9"),
        (_file(MANIFEST.replace("name: b,", f"name: {HUGE},")), 2, ": pods[1].name"),
        (_file(MANIFEST.replace("pod: a,", f"pod: {HUGE},")), 1, "caps[0].pod"),
    ],
    ids=["duplicate-cap-key", "duplicate-pods", "deep", "bomb", "dev-zero", "20MiB", "latin1", "huge-name", "huge-pod"],
)
def test_apply_refuses_the_file_and_keeps_what_is_stored(
    tmp_path: Path, served: tuple[str, dict[str, object]], make: Callable[[Path], Path], code: int, expect: str
) -> None:
    server, before = served
    f = make(tmp_path)
    res = run_cli("apply", "-f", str(f), "--server", server)
    assert res.returncode == code, res.stderr[-SHORT:]
    assert len(res.stderr) < SHORT and "Traceback" not in res.stderr, res.stderr[-SHORT:]
    assert res.stderr.startswith(f"dpu-limiter: {f}") and expect in res.stderr, res.stderr
    assert stored(server) == before


def test_a_scenario_with_megabyte_values_keeps_its_error_short(tmp_path: Path) -> None:
    """The lab's scenario errors cut values and messages too, and list at most 20 problems."""
    from dpu_lab.config import ConfigError, load_scenario

    huge = "X" * 1_000_000
    caps = [{"pod": huge, "egress": huge, "ingress": "1G", "window_s": 2} for _ in range(50)]
    doc = {"name": huge, "topology": str(ROOT / "bmv2-lab" / "topologies" / "two-pods.yaml"), "caps": caps}
    path = tmp_path / "big.yaml"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and len(text) < 8_000, len(text)


def test_cap_set_without_window_cuts_a_long_pod_name(served: tuple[str, dict[str, object]]) -> None:
    """`cap set` on a pod without a cap names the pod cut to a bounded excerpt, not its whole name."""
    server, before = served
    res = run_cli("cap", "set", "p" * 100_000, "--egress", "1G", "--ingress", "1G", "--server", server)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-SHORT:]
    assert len(res.stderr) < SHORT and "--window" in res.stderr and "100000 chars" in res.stderr, res.stderr[:SHORT]
    assert stored(server) == before


@pytest.mark.parametrize("kind", ["pod", "dpu"])
def test_delete_cuts_long_names_in_its_error(served: tuple[str, dict[str, object]], kind: str) -> None:
    """`delete pod|dpu NAMES` refused by the control plane keeps its title bounded and deletes nothing."""
    server, before = served
    res = run_cli("delete", kind, "a", "n" * 100_000, "--server", server)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-SHORT:]
    assert len(res.stderr) < SHORT and "nothing deleted" in res.stderr, res.stderr[:SHORT]
    assert stored(server) == before
