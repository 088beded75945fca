#!/usr/bin/env bash
# Makes sure a real headless browser is here for the console's test: Debian's chromium
# and chromium-driver (installed with apt-get when missing; no browser is downloaded at
# run time). Prints the driver's path, then the browser's.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec 9>/var/tmp/tiergate-browser.lock
flock 9   # one installer at a time
if [ ! -x /usr/bin/chromedriver ] || [ ! -x /usr/bin/chromium ]; then
  scripts/apt-install.sh chromium chromium-driver
fi
echo /usr/bin/chromedriver
echo /usr/bin/chromium
