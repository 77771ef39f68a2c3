#!/usr/bin/env bash
# Runs hack/plot-scale.py with matplotlib: the system's when it has it, else
# a virtual environment in the tool cache (made once, from PyPI).
#
#   hack/plot-env.sh <scale.csv> <out.png>
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if python3 -c 'import matplotlib' 2>/dev/null; then
  exec python3 "$root/hack/plot-scale.py" "$@"
fi
venv=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}/venv-plot
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  echo "hack/plot-env.sh: installing matplotlib into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'matplotlib>=3.8,<4'
fi
exec "$venv/bin/python" "$root/hack/plot-scale.py" "$@"
