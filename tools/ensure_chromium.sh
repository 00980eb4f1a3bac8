#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the browser check (tests/test_browser.py).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian's chromium for the browser check..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core fonts-wqy-zenhei >/dev/null
else
  echo "The browser check needs Debian's 'chromium' package: run 'sudo apt-get install chromium'." >&2
  exit 1
fi
