#!/usr/bin/env bash
# Conformance, run by hand (not in CI): Ansible's community.proxmox.proxmox_kvm against the
# PVE simulator over HTTPS with API-token auth (validate_certs: false).
#
# Uses target/ansible-venv (created here when missing: ansible==12.3.0, proxmoxer==2.3.0,
# requests), starts proxops-pvesim on a free 127.0.0.1 port, and plays ansible/create-vm.yml
# three times against it: create (changed) -> the same again (ok, no change) -> memory=1024
# with update=true (changed). Each play asserts its own expected `changed` and reads the
# config back. Extra arguments go to every ansible-playbook run (e.g. -vvv).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."   # repository root
# shellcheck source=sim-lib.sh
source "$here/sim-lib.sh"

venv="$(realpath -m "${CARGO_TARGET_DIR:-target}/ansible-venv")"
if [[ ! -x "$venv/bin/ansible-playbook" ]]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    ansible==12.3.0 proxmoxer==2.3.0 requests==2.34.2
fi
"$venv/bin/python" -c 'from importlib.metadata import version as v; print("== ansible", v("ansible"), "ansible-core", v("ansible-core"), "proxmoxer", v("proxmoxer"), "requests", v("requests"))'
"$venv/bin/ansible-galaxy" collection list community.proxmox 2>/dev/null | grep '^community.proxmox' | sed 's/^/== /'

start_sim ansible "$venv/bin/python"

export LC_ALL=C.UTF-8 ANSIBLE_LOCALHOST_WARNING=False ANSIBLE_INVENTORY_UNPARSED_WARNING=False \
  ANSIBLE_NOCOLOR=1 ANSIBLE_RETRY_FILES_ENABLED=False
play() {
  local title="$1"
  shift
  echo "== run: $title"
  "$venv/bin/ansible-playbook" -i localhost, \
    -e "ansible_python_interpreter=$venv/bin/python" -e "pvesim_port=$SIM_PORT" \
    "$here/ansible/create-vm.yml" "$@"
}
play "1 create (expect changed)" -e expect_changed=true "$@"
play "2 same again (expect ok, no change)" -e expect_changed=false "$@"
play "3 update memory=1024 (expect changed)" -e expect_changed=true -e memory=1024 -e update=true "$@"
sim_request_summary "$venv/bin/python"
echo "== all three runs as expected"
