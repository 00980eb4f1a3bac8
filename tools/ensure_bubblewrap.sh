#!/usr/bin/env bash
# Make sure bubblewrap (bwrap) is installed: `klbook grade` runs student notebooks in a
# bubblewrap sandbox and refuses to grade without one (see grading.md). Idempotent.
# The sandbox's seccomp filter needs libseccomp too: tools/ensure_seccomp.sh.
set -euo pipefail
bash "$(dirname "$0")/ensure_seccomp.sh"
if command -v bwrap >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian's bubblewrap for the grader's sandbox..."
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  }
  command -v bwrap >/dev/null 2>&1 && exit 0
fi
echo "The grader needs bubblewrap: run 'sudo apt-get install bubblewrap' (Debian/Ubuntu)" \
     "or your distribution's equivalent." >&2
exit 1
