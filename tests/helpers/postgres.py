"""A throwaway PostgreSQL cluster for the tests: initdb and pg_ctl in a temporary directory, listening on
127.0.0.1 and a free port only (its unix socket in that directory too), stopped and removed afterwards.

initdb and postgres refuse to run as root: as root (the tests' CI), the cluster runs as the `postgres`
user where it exists, else `nobody`, through runuser, in a directory that user owns. Where something is
missing (PostgreSQL's binaries, psycopg, such a user), `unavailable()` says what, for a skip.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from helpers.processes import free_port

USER = "dpu"  # the cluster's superuser (trust authentication, loopback only)


def _bin_dir() -> Path | None:
    """The newest installed PostgreSQL's binaries (Debian's /usr/lib/postgresql/N/bin), else PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    return None


def _run_as() -> tuple[list[str], str | None]:
    """The command prefix that runs the cluster as an unprivileged user (none when not root), and that user."""
    if os.geteuid() != 0:
        return [], None
    for user in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            if shutil.which("runuser"):
                return ["runuser", "-u", user, "--"], user
    return [], None


def unavailable() -> str | None:
    """Why no cluster can be started here (None: one can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg 3 is not installed (pip install 'dpu-limiter[postgres]')"
    if _bin_dir() is None:
        return "PostgreSQL's initdb and pg_ctl are not installed (apt-get install postgresql)"
    if os.geteuid() == 0 and not _run_as()[0]:
        return "running as root, with no `postgres` or `nobody` user and runuser to run PostgreSQL as"
    return None


@dataclass
class Cluster:
    """A running throwaway cluster: `database()` makes a new empty database and gives its URL."""

    port: int
    root: Path
    _names: Iterator[int]
    _ctl: list[str] = field(default_factory=list)  # pg_ctl on the data directory, as the cluster's user
    _options: str = ""  # the server's options (its port, loopback only)

    def url(self, db: str = "postgres") -> str:
        """The URL of database `db` on the cluster."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{db}"

    def database(self) -> str:
        """A new, empty database's URL (each test its own: no test sees another's state)."""
        import psycopg

        name = f"t{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")  # a name of ours
        return self.url(name)

    def crash(self) -> None:
        """Stop the server as a crash would (pg_ctl's immediate mode: no checkpoint; the next start recovers
        from the write-ahead log)."""
        subprocess.run([*self._ctl, "-m", "immediate", "-w", "stop"], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        """Start the server (again), on the same port and data directory; returns once it takes connections."""
        log = self.root / "postgres.log"
        start = [*self._ctl, "-l", str(log), "-o", self._options, "-w", "-t", "60", "start"]
        subprocess.run(start, check=True, capture_output=True, timeout=90)

    def ctl_script(self, path: Path) -> Path:
        """A script at `path` that stops (`path stop`) and starts (`path start`) the server, as an operator's
        pg_ctlcluster would (the lab's --control-db-ctl)."""
        start = [*self._ctl, "-l", str(self.root / "postgres.log"), "-o", self._options, "-w", "-t", "60", "start"]
        path.write_text(
            "#!/bin/sh\n"
            'case "$1" in\n'
            f"  stop) exec {shlex.join([*self._ctl, '-m', 'fast', '-w', 'stop'])} ;;\n"
            f"  start) exec {shlex.join(start)} ;;\n"
            "esac\n"
            "exit 2\n"
        )
        path.chmod(0o755)
        return path

    def sql(self, url: str, *statements: str) -> None:
        """Run statements on a database behind the control plane's back (as an operator's psql would)."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for s in statements:
                conn.execute(s.encode())


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """Start a cluster in a new temporary directory; stop it (pg_ctl stop on its data directory) and
    remove the directory when the block ends."""
    why = unavailable()
    if why:
        raise RuntimeError(why)
    bindir = _bin_dir()
    assert bindir is not None
    prefix, user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="dpu-limiter-pg-"))  # in /tmp, which that user can reach
    data, log = root / "data", root / "postgres.log"
    try:
        if user:
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        # --no-sync: initdb's own files only; the server itself runs with fsync on, as in production.
        initdb = [str(bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"]
        subprocess.run([*prefix, *initdb], check=True, capture_output=True, timeout=120)
        port = free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c max_connections=50"
        c = Cluster(port, root, itertools.count(1), [*prefix, str(bindir / "pg_ctl"), "-D", str(data)], options)
        c.start()
        try:
            yield c
        finally:
            subprocess.run([*c._ctl, "-m", "fast", "-w", "stop"], capture_output=True, timeout=60)
    except subprocess.CalledProcessError as exc:
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(f"{exc.cmd[len(prefix)]} failed: {exc.stderr.decode()[-2000:]} {tail}") from exc
    finally:
        shutil.rmtree(root, ignore_errors=True)
