#!/usr/bin/env bash
# Every Debian package the system tests use, in one apt transaction: slurm-wlm and munge (cluster/local/up.sh),
# chromium and its WebDriver (system_tests/install_browser.sh). Each of those installs what it needs when missing;
# .ci/run runs this first, in the background while pip builds the venv, so that the system tests find them.
# Needs root; without it, or when everything is there, it does nothing.
set -euo pipefail
packages=(slurm-wlm munge chromium chromium-driver fonts-dejavu-core)
if [ "$(id -u)" -ne 0 ]; then
  echo "system_tests/install_packages.sh: not root, nothing installed" >&2
  exit 0
fi
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
echo "system_tests/install_packages.sh: installing ${missing[*]} (apt)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
