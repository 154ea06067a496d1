#!/usr/bin/env bash
# Debian's headless browser for system_tests/test_report.py: chromium and its WebDriver (root; apt).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core
