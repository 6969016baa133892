#!/usr/bin/env bash
# Create benchmarks/.venv: the project (editable, with the PostgreSQL driver) beside the peers
# we measure against, each installed from PyPI by name. Re-running it updates the venv.
#
#   bash benchmarks/setup.sh            # uses python3 from PATH
#   PYTHON=python3.12 bash benchmarks/setup.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-python3}"
venv="$here/.venv"

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet \
    -e "$root[postgres,mysql,metrics,redis]" \
    "procrastinate>=3,<4" \
    "apscheduler>=3.11,<4" \
    "psycopg[binary,pool]>=3.2" \
    "psutil>=5.9" \
    "py-spy>=0.3"
"$venv/bin/python" - <<'PY'
from importlib.metadata import version

names = ("scheduler", "procrastinate", "apscheduler", "sqlalchemy", "psycopg", "pymysql")
print("benchmarks/.venv ready:", ", ".join(f"{n} {version(n)}" for n in names))
PY
