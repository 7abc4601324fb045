#!/usr/bin/env bash
# Creates (idempotently) the Python environment for p4runtime-shell, the standard P4Runtime
# client used by tests/softswitch/test_p4runtime_shell.py. It needs its own venv: p4runtime-shell 0.0.6 pins
# protobuf<3.21 and p4runtime==1.4.1, while the project itself uses protobuf 6.
#
#   bash tests/softswitch/p4rt_shell/env.sh [VENV_DIR]     # default: <repo>/.venv-p4rt-shell
#
# Prints the venv's python path last, for DPU_P4RT_SHELL_PYTHON.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${1:-$repo_root/.venv-p4rt-shell}"

# Everything in the resolved set is pinned so the install is reproducible:
#  - protobuf 3.20.3: the newest release p4runtime-shell allows (<3.21); a pure-Python wheel,
#    so nothing is compiled on 3.11 (googleapis-common-protos below also needs >=3.20.2).
#  - grpcio 1.85.3: same as the project's dev venv; grpcio does not depend on protobuf, and it
#    ships cp311 wheels (releases before 1.49 do not, and would need a compiler).
#  - googleapis-common-protos 1.73.0 (google.rpc.Status, used to decode write errors): its
#    gencode imports and parses with protobuf 3.20.3 (checked).
#  - ipython 7.31.1 / jedi 0.17.2 are p4runtime-shell's own pins; the rest are their deps.
pins=(
    p4runtime-shell==0.0.6
    p4runtime==1.4.1
    protobuf==3.20.3
    grpcio==1.85.3
    googleapis-common-protos==1.73.0
    typing-extensions==4.16.0
    ipython==7.31.1
    jedi==0.17.2
    parso==0.7.1
    backcall==0.2.0
    decorator==5.3.1
    matplotlib-inline==0.2.2
    pexpect==4.9.0
    pickleshare==0.7.5
    prompt-toolkit==3.0.53
    ptyprocess==0.7.0
    pygments==2.21.0
    traitlets==5.16.1
    wcwidth==0.9.4
)

check() { "$venv/bin/python" -c "import p4runtime_sh.shell" 2>/dev/null; }

if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
# A stamp of the pin list lets re-runs skip pip (fast, offline) unless the pins changed.
stamp="$venv/.p4rt-shell-pins"
if ! check || [[ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
    echo "${pins[*]}" >"$stamp"
fi
check || { echo "env.sh: 'import p4runtime_sh.shell' fails in $venv" >&2; exit 1; }
echo "$venv/bin/python"
