#!/usr/bin/env bash
# Create benchmarks/peers/.venv: this checkout (editable, with the PostgreSQL driver) beside the
# peers of requirements.txt, each installed from PyPI by name. Re-running it updates the venv.
#
#   bash benchmarks/peers/setup.sh             # python3 from PATH
#   PYTHON=python3.12 bash benchmarks/peers/setup.sh   # 3.12+ also installs oban-py
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$(dirname "$here")")"
python="${PYTHON:-python3}"
venv="$here/.venv"

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip || true
"$venv/bin/python" -m pip install --quiet -e "$root[postgres]" -r "$here/requirements.txt"
if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
    "$venv/bin/python" -m pip install --quiet "oban>=0.7" || echo "oban-py did not install: skipped"
else
    echo "oban-py (PyPI 'oban') needs Python >= 3.12; $("$venv/bin/python" -V) here: skipped"
fi
"$venv/bin/python" - <<'PY'
from importlib.metadata import PackageNotFoundError, version

found = []
for name in ("rerun-scheduler", "pgqueuer", "procrastinate", "oban", "asyncpg", "psycopg"):
    try:
        found.append(f"{name} {version(name)}")
    except PackageNotFoundError:
        found.append(f"{name} -")
print("benchmarks/peers/.venv ready:", ", ".join(found))
PY
