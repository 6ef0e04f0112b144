# Sourced by scripts/test, scripts/check-packaging and scripts/check-compat (from the checkout's
# root): which dev/test lock (scripts/lock) pins the packages a given Python installs.
#
#   lock_for PYTHON     prints constraints/dev-pyXY.txt for that Python, or nothing when the
#                       project has no lock for it (then pip resolves the newest releases)
#   lock_without FILE NAME...   prints FILE's pins less those of NAME... (a set that pins them
#                       otherwise, e.g. the oldest Celery), for `pip install -c`
lock_for() {
  local file
  file="constraints/dev-py$("$1" -c 'import sys; print("%d%d" % sys.version_info[:2])').txt"
  if [ -f "$file" ]; then echo "$file"; fi
}

lock_without() {
  local file=$1 names
  shift
  names=$(IFS='|'; echo "$*")
  grep -viE "^(${names//./\\.})==" "$file" || true
}

# python_for X.Y: a Python X.Y interpreter (pyenv's newest X.Y.*, else pythonX.Y on PATH that
# runs), or nothing when this machine has none.
python_for() {
  local found
  found=$(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/"$1".*/bin/python \
          2>/dev/null | sort -V | tail -n 1)
  if [ -n "$found" ]; then echo "$found"
  elif "python$1" -V >/dev/null 2>&1; then command -v "python$1"
  fi
}
