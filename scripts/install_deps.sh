#!/usr/bin/env bash
# Installs what the build and tests need, only when it is missing:
#   Debian packages: doctest-dev, libtomlplusplus-dev, nlohmann-json3-dev, libopenmpi-dev,
#   openmpi-bin (and python3-numpy/python3-matplotlib for the plotting script);
# then the Python packages scripts/prepare_data.py reads with (pyarrow: Parquet and arrow;
# zstandard: .zst; tokenizers: tokenizer.json) for the tests' python, with pip into the user site
# (or the active venv), only those that do not import; when pip cannot (no network), a
# warning, and their tests skip;
# then copies the header-only libraries into .deps/include (git-ignored) so a copy of the tree
# shipped to a machine without them (the GPU machine) still builds.
#   --headers-only   skip the package steps (used by make when a header copy is missing)
# Env: PYTHON (default /usr/bin/python3, else python3, as the Makefile); NO_PIP=1 skips them.
set -euo pipefail
cd "$(dirname "$0")/.."

headers_only=0
[[ "${1:-}" == "--headers-only" ]] && headers_only=1

have_header() { [[ -f "/usr/include/$1" || -f ".deps/include/$1" ]]; }

if [[ $headers_only == 0 ]]; then
  missing=()
  have_header doctest/doctest.h || missing+=(doctest-dev)
  have_header toml++/toml.h || missing+=(libtomlplusplus-dev)
  have_header nlohmann/json.hpp || missing+=(nlohmann-json3-dev)
  command -v mpicxx >/dev/null 2>&1 || missing+=(libopenmpi-dev)
  command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
  if [[ -x /usr/bin/python3 ]] && ! /usr/bin/python3 -c "import matplotlib" >/dev/null 2>&1; then
    missing+=(python3-numpy python3-matplotlib)
  fi
  if (( ${#missing[@]} )); then
    echo "installing: ${missing[*]}"
    sudo=""
    [[ $(id -u) != 0 ]] && sudo="sudo"
    if ! command -v apt-get >/dev/null 2>&1; then
      echo "error: missing ${missing[*]} and no apt-get to install them" >&2
      exit 1
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

if [[ $headers_only == 0 && "${NO_PIP:-0}" != 1 ]]; then
  # The python the Makefile's tests run (its PYTHON default).
  py=${PYTHON:-$(command -v /usr/bin/python3 2>/dev/null || command -v python3 || true)}
  if [[ -n "$py" ]]; then
    missing=()
    for m in pyarrow zstandard tokenizers; do
      "$py" -c "import $m" >/dev/null 2>&1 || missing+=("$m")
    done
    if (( ${#missing[@]} )); then
      specs=()
      for m in "${missing[@]}"; do
        # pyarrow 26 refuses to import beside NumPy 1.x (Debian 12's python3-numpy); 25 works with both.
        if [[ $m == pyarrow ]] && "$py" -c "import numpy, sys; sys.exit(int(numpy.__version__.split('.')[0]) >= 2)" 2>/dev/null; then
          specs+=("pyarrow<26")
        else
          specs+=("$m")
        fi
      done
      echo "installing (pip, user site): ${specs[*]}"
      flags=(--quiet --disable-pip-version-check --no-deps)  # none of the three needs its dependencies here
      if "$py" -c "import sys; sys.exit(sys.prefix != sys.base_prefix)"; then
        flags+=(--user)  # not inside a venv, where --user is refused
        # A distribution's python (PEP 668) takes user-site installs only with this flag.
        "$py" -c "import sys, sysconfig, os; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['stdlib'], 'EXTERNALLY-MANAGED')))" &&
          flags+=(--break-system-packages)
      fi
      if ! "$py" -m pip install "${flags[@]}" "${specs[@]}"; then
        echo "warning: pip could not install ${specs[*]}: the data-preparation tests that need them skip" >&2
      fi
    fi
  fi
fi

mkdir -p .deps/include
for dir in toml++ nlohmann doctest; do
  if [[ ! -d ".deps/include/$dir" ]]; then
    if [[ -d "/usr/include/$dir" ]]; then
      cp -r "/usr/include/$dir" .deps/include/
    elif [[ "$dir" != doctest ]]; then
      echo "error: /usr/include/$dir not found; run 'make deps' on a Debian machine first" >&2
      exit 1
    fi
  fi
done
