#!/usr/bin/env bash
# Installs what the build and tests need, only when it is missing:
#   Debian packages: doctest-dev, libtomlplusplus-dev, nlohmann-json3-dev, libopenmpi-dev,
#   openmpi-bin (and python3-numpy/python3-matplotlib for the plotting script);
# then copies the header-only libraries into .deps/include (git-ignored) so a copy of the tree
# shipped to a machine without them (the GPU machine) still builds.
#   --headers-only   skip the package step (used by make when a header copy is missing)
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
