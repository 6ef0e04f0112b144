# Sourced by scripts/test, scripts/check-packaging, scripts/check-compat and .ci/run (from the
# checkout's root): which dev/test lock (scripts/lock) pins the packages a given Python installs,
# and delayq's wheel for the two checks.
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

# delayq_wheel DIR: the path of delayq's wheel (`pip wheel --no-deps`: its own, nothing else):
# DELAYQ_WHEEL when set (.ci/run builds one for check-packaging and check-compat, which run at
# once), else one built from the checkout into DIR.
delayq_wheel() {
  if [ -n "${DELAYQ_WHEEL:-}" ]; then echo "$DELAYQ_WHEEL"; return; fi
  "${PYTHON:-python3}" -m pip wheel --no-deps --disable-pip-version-check -q -w "$1" . 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  ls "$1"/delayq-*.whl
}
