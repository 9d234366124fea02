#!/usr/bin/env bash
# Installs what the build and tests need, only when it is missing:
#   Debian packages: doctest-dev, libtomlplusplus-dev, nlohmann-json3-dev, libopenmpi-dev,
#   openmpi-bin (and python3-numpy/python3-matplotlib for the plotting script);
# then the Python packages scripts/prepare_data.py reads with (pyarrow: Parquet and arrow;
# zstandard: .zst; tokenizers: tokenizer.json), with pip into the user site (or the active venv),
# only those missing; when pip cannot (no network), a warning, and their tests skip;
# then copies the header-only libraries into .deps/include (git-ignored) so a copy of the tree
# shipped to a machine without them (the GPU machine) still builds.
#   --headers-only   skip the package steps (used by make when a header copy is missing)
# Env: PYTHON (default python3); NO_PIP=1 skips the Python packages.
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
  py=${PYTHON:-python3}
  if command -v "$py" >/dev/null 2>&1; then
    missing=()
    for m in pyarrow zstandard tokenizers; do
      "$py" -c "import $m" >/dev/null 2>&1 || missing+=("$m")
    done
    if (( ${#missing[@]} )); then
      echo "installing (pip): ${missing[*]}"
      user=--user  # not inside a venv, where --user is refused
      "$py" -c "import sys; sys.exit(sys.prefix == sys.base_prefix)" && user=""
      if ! "$py" -m pip install --quiet --disable-pip-version-check $user "${missing[@]}"; then
        echo "warning: pip could not install ${missing[*]}: the data-preparation tests that need them skip" >&2
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
