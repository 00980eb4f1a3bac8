#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the browser check (tests/test_browser.py).
set -euo pipefail
# the Chinese edition's pages and PDF need a CJK font (issue 27); Debian's chromium alone has none
ensure_cjk_font() {
  if command -v fc-list >/dev/null 2>&1 && [ -n "$(fc-list :lang=zh 2>/dev/null)" ]; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing a CJK font (fonts-wqy-zenhei) for the Chinese edition..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-wqy-zenhei >/dev/null
  else
    echo "note: no CJK font: the Chinese edition renders without Chinese glyphs ('sudo apt-get install fonts-wqy-zenhei')" >&2
  fi
}
if command -v chromium >/dev/null 2>&1; then ensure_cjk_font; exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian's chromium for the browser check..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core fonts-wqy-zenhei >/dev/null
else
  echo "The browser check needs Debian's 'chromium' package: run 'sudo apt-get install chromium'." >&2
  exit 1
fi
