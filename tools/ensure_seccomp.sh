#!/usr/bin/env bash
# Make sure libseccomp (libseccomp.so.2) is installed: the grader builds its sandbox's seccomp
# filter with it (the pinned `pyseccomp` binding of requirements.txt loads it; see grading.md).
# Debian and Ubuntu ship it with apt itself; elsewhere install your distribution's libseccomp.
# Idempotent; called by tools/ensure_bubblewrap.sh (make setup, .ci/run).
set -euo pipefail
have() { ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || ls /usr/lib/*/libseccomp.so.2 /usr/lib64/libseccomp.so.2 /lib/*/libseccomp.so.2 >/dev/null 2>&1; }
if have; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian's libseccomp2 for the grader's seccomp filter..."
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp2 >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp2 >/dev/null
  }
  have && exit 0
fi
echo "The grader needs libseccomp: run 'sudo apt-get install libseccomp2' (Debian/Ubuntu)" \
     "or your distribution's equivalent." >&2
exit 1
