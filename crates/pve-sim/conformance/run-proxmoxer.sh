#!/usr/bin/env bash
# Conformance: proxmoxer (pinned, from PyPI) against the PVE simulator over HTTPS.
#
# Creates/reuses the venv target/conformance-venv (pins in requirements.txt), builds
# proxops-pvesim (debug) if needed, starts it on a free 127.0.0.1 port with its self-signed
# certificate (the client uses verify_ssl=False), runs proxmoxer_test.py, and always stops
# the simulator on exit. The script's last line is `N passed, N failed[, N skipped]`; the
# exit status is non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."   # repository root
# shellcheck source=sim-lib.sh
source "$here/sim-lib.sh"

venv="${CARGO_TARGET_DIR:-target}/conformance-venv"
req="$here/requirements.txt"

# Reuse the venv while requirements.txt is unchanged.
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "== creating $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" >"$stamp"
else
  echo "== reusing $venv"
fi
"$venv/bin/python" -c 'import proxmoxer, requests; print("proxmoxer", proxmoxer.__version__, "requests", requests.__version__)'

start_sim proxmoxer "$venv/bin/python"

out="${CARGO_TARGET_DIR:-target}/conformance/proxmoxer-output.txt"
set +e
PVESIM_HOST="127.0.0.1:$SIM_PORT" "$venv/bin/python" "$here/proxmoxer_test.py" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
set -e
sim_request_summary "$venv/bin/python" || echo "(request log unavailable)"
# Repeat the client's closing `N passed, N failed` line so it stays the last line.
tail -n 1 "$out"
exit "$rc"
