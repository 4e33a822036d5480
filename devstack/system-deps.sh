#!/usr/bin/env bash
# Install what tock's local stack needs from the OS when it is missing: PostgreSQL server
# binaries, and with `--browser` Chromium (only the dashboard's browser tests use it, so
# `make run` does not install it).
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 \
  || need+=(postgresql)
if [ "${1:-}" = "--browser" ]; then
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
fi
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
echo "installing system packages: ${need[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing ${need[*]} and no apt-get here: install them with your package manager" >&2
  exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
