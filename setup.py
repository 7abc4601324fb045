"""Build hook: generate the API's Python stubs with grpcio-tools and bundle the compiled P4.

Generated code is made here, at build time, never committed. protoc's virtual path mapping
(-Idpu_limiter/_proto=protos) makes the generated modules import each other under the
dpu_limiter package while protos/ keeps the plain limiter/v1 layout other languages expect.
"""

import shutil
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
PKG = ROOT / "control" / "dpu_limiter"


def generate() -> None:
    """Write dpu_limiter/_proto/** from protos/ and copy p4/ artifacts into dpu_limiter/p4/."""
    from grpc_tools import protoc  # build requirement

    out = PKG / "_proto"
    shutil.rmtree(out, ignore_errors=True)
    protos = sorted((ROOT / "protos").rglob("*.proto"))
    args = [
        "protoc",
        f"-Idpu_limiter/_proto={ROOT / 'protos'}",
        f"--python_out={PKG.parent}",
        f"--pyi_out={PKG.parent}",
        f"--grpc_python_out={PKG.parent}",
    ]
    args += [f"dpu_limiter/_proto/{p.relative_to(ROOT / 'protos').as_posix()}" for p in protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on protos/")
    for d in [out, *[p for p in out.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    p4_out = PKG / "p4"
    shutil.rmtree(p4_out, ignore_errors=True)
    p4_out.mkdir()
    (p4_out / "__init__.py").write_text('"""Compiled P4 programs (copied from p4/ at build time)."""\n')
    for f in (ROOT / "p4").iterdir():
        if f.suffix in (".json", ".txtpb", ".p4"):
            shutil.copy2(f, p4_out / f.name)


# Generate before setuptools looks for packages: the generated ones must exist by then.
generate()
setup()
