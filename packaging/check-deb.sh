#!/usr/bin/env bash
# Checks the proxops .deb that packaging/build-deb.sh made:
#  1. its file list (dpkg-deb -c) and control fields (dpkg-deb -f, conffiles);
#  2. the unit with `systemd-analyze verify` (before installing, the only complaint allowed is
#     that /usr/bin/proxops is not there yet);
#  3. only when CI=true or PROXOPS_ALLOW_DPKG=1 (it changes the machine): `dpkg -i`, then
#     `/usr/bin/proxops --version`, the system user, the unit enabled and not started, the
#     installed unit verified with no complaint at all, and `dpkg -r` / `dpkg -P` to clean up.
# Usage: packaging/check-deb.sh [path/to/proxops_*.deb]
set -euo pipefail
cd "$(dirname "$0")/.."

deb="${1:-}"
if [[ -z "$deb" ]]; then
  debs=("${CARGO_TARGET_DIR:-target}"/debian/proxops_*.deb)
  deb="${debs[-1]}"
fi
[[ -f "$deb" ]] || { echo "check-deb: no .deb at $deb (run packaging/build-deb.sh)" >&2; exit 1; }
echo "check-deb: $deb"

fail() {
  echo "check-deb: FAIL: $*" >&2
  exit 1
}

if ! command -v systemd-analyze >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq systemd >/dev/null
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. Files and modes.
dpkg-deb -c "$deb" | awk '{ print $1, $NF }' | sed 's# \./# /#' >"$work/files"
expect_file() {
  local mode="$1" path="$2"
  grep -qxF -- "$mode $path" "$work/files" || fail "expected $mode $path in the package"
}
expect_file -rwxr-xr-x /usr/bin/proxops
expect_file -rw-r--r-- /etc/proxops/agent.toml
expect_file -rw-r--r-- /usr/lib/systemd/system/proxops-agent.service
expect_file -rw-r--r-- /usr/lib/sysusers.d/proxops.conf
expect_file -rw-r--r-- /usr/share/bash-completion/completions/proxops
expect_file -rw-r--r-- /usr/share/zsh/vendor-completions/_proxops
expect_file -rw-r--r-- /usr/share/fish/vendor_completions.d/proxops.fish
expect_file -rw-r--r-- /usr/share/man/man1/proxops.1.gz
expect_file -rw-r--r-- /usr/share/man/man1/proxops-agent.1.gz
for doc in README.md MIGRATING.md GAPS.md operations.md copyright examples/agent.toml.example; do
  expect_file -rw-r--r-- "/usr/share/doc/proxops/$doc"
done
if grep -q pvesim "$work/files"; then
  fail "the simulator is a development tool and must not be packaged"
fi
if grep -E '^-' "$work/files" | grep -vE '^-rw[-x]r-[-x]r-[-x] ' >/dev/null; then
  fail "a file is not world-readable or is writable by others: $(grep -E '^-' "$work/files" | grep -vE '^-rw[-x]r-[-x]r-[-x] ')"
fi
echo "check-deb: $(grep -c '^-' "$work/files") files, modes as expected, no simulator"

# Control fields.
field() { dpkg-deb -f "$deb" "$1"; }
[[ "$(field Package)" == proxops ]] || fail "Package is $(field Package)"
[[ "$(field Section)" == admin ]] || fail "Section is $(field Section)"
[[ "$(field Priority)" == optional ]] || fail "Priority is $(field Priority)"
[[ -n "$(field Maintainer)" ]] || fail "no Maintainer"
[[ -n "$(field Description)" ]] || fail "no Description"
[[ "$(field Version)" == "$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)-1" ]] ||
  fail "Version $(field Version) is not the workspace version"
depends="$(field Depends)"
for dep in git openssh-client systemd libc6; do
  [[ ", $depends," == *", $dep"[\ ,]* ]] || fail "Depends ($depends) lacks $dep"
done
dpkg-deb -e "$deb" "$work/control"
[[ "$(cat "$work/control/conffiles")" == /etc/proxops/agent.toml ]] ||
  fail "conffiles: $(cat "$work/control/conffiles")"
grep -q 'systemd-sysusers.*proxops.conf' "$work/control/postinst" || fail "postinst does not run systemd-sysusers"
grep -q 'deb-systemd-helper enable proxops-agent.service' "$work/control/postinst" ||
  fail "postinst does not enable the unit"
if grep -q 'deb-systemd-invoke start' "$work/control/postinst"; then
  fail "postinst starts the unit before it is configured"
fi
echo "check-deb: control fields: Depends: $depends; conffiles and maintainer scripts as expected"

# The default config parses as TOML and sets nothing.
dpkg-deb -x "$deb" "$work/root"
python3 - "$work/root/etc/proxops/agent.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    data = tomllib.load(f)
if data:
    sys.exit(f"check-deb: FAIL: the default agent.toml sets {sorted(data)}; every key must be commented")
PY
echo "check-deb: /etc/proxops/agent.toml parses and sets no key"

# 2. The unit, before installing: the binary is not on this machine yet, so that one
# complaint is expected; anything else fails.
verify_unit() {
  local unit="$1" allowed="$2" out
  out="$(systemd-analyze verify --man=no "$unit" 2>&1 || true)"
  if [[ -n "$allowed" ]]; then
    out="$(grep -vxF -- "$allowed" <<<"$out" || true)"
  fi
  if [[ -n "$out" ]]; then
    echo "$out" >&2
    fail "systemd-analyze verify $unit"
  fi
}
unit="$work/root/usr/lib/systemd/system/proxops-agent.service"
if [[ -x /usr/bin/proxops ]]; then
  verify_unit "$unit" ""
else
  verify_unit "$unit" "proxops-agent.service: Command /usr/bin/proxops is not executable: No such file or directory"
fi
echo "check-deb: systemd-analyze verify (extracted unit): OK"
# The resource controls and the CA credential (SECURITY-AUDIT.md L4, L5) stay in the unit.
for setting in MemoryHigh= MemoryMax= OOMScoreAdjust= LimitNOFILE=65536 TasksMax= LimitCORE=0 \
  LoadCredential=pve-root-ca:/etc/pve/pve-root-ca.pem; do
  grep -q "^$setting" "$unit" || fail "the unit lacks $setting"
done
# Write access for cloud-init snippets (issue 21): the snippets directory of `local`, and
# nothing else of the read-only system.
grep -qx 'ReadWritePaths=-/var/lib/vz/snippets' "$unit" ||
  fail "the unit lacks ReadWritePaths=-/var/lib/vz/snippets"
if [[ "$(grep -c '^ReadWritePaths=' "$unit")" != 1 ]]; then
  fail "the unit opens more than the snippets directory for writing"
fi
if grep -q '^SupplementaryGroups=' "$unit"; then
  fail "the unit sets SupplementaryGroups= (the CA comes as a credential)"
fi
echo "check-deb: resource controls and the CA credential: OK"
if systemd-analyze security --help 2>/dev/null | grep -q -- --offline; then
  systemd-analyze security --offline=yes --no-pager "$unit" 2>/dev/null | tail -n 1 || true
fi

# 3. Install, run, remove: only on a throwaway machine.
if [[ "${CI:-}" != true && "${PROXOPS_ALLOW_DPKG:-}" != 1 ]]; then
  echo "check-deb: skipping dpkg -i (set CI=true or PROXOPS_ALLOW_DPKG=1 on a throwaway machine)"
  exit 0
fi
if dpkg-query -W -f='${Status}' proxops 2>/dev/null | grep -q '^install ok installed$'; then
  fail "proxops is already installed here; not replacing it"
fi
cleanup() {
  dpkg -r proxops >/dev/null 2>&1 || true
  dpkg -P proxops >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

dpkg -i "$deb"
/usr/bin/proxops --version
getent passwd proxops | grep -q ':/var/lib/proxops:/usr/sbin/nologin$' ||
  fail "the proxops system user: $(getent passwd proxops || echo missing)"
[[ -L /etc/systemd/system/multi-user.target.wants/proxops-agent.service ]] ||
  fail "the unit is not enabled"
verify_unit /usr/lib/systemd/system/proxops-agent.service ""
echo "check-deb: systemd-analyze verify (installed unit): OK"
bash -c 'source /usr/share/bash-completion/completions/proxops && complete -p proxops' >/dev/null ||
  fail "the bash completion does not load"
man -w proxops >/dev/null 2>&1 || [[ ! -x /usr/bin/man ]] || fail "man proxops not found"

dpkg -r proxops
[[ ! -e /usr/bin/proxops ]] || fail "/usr/bin/proxops left after dpkg -r"
[[ -e /etc/proxops/agent.toml ]] || fail "dpkg -r removed the conffile (only purge may)"
dpkg -P proxops
[[ ! -e /etc/proxops/agent.toml ]] || fail "/etc/proxops/agent.toml left after dpkg -P"
[[ ! -L /etc/systemd/system/multi-user.target.wants/proxops-agent.service ]] ||
  fail "the enable symlink is left after purge"
echo "check-deb: dpkg -i, --version, user, enabled unit, dpkg -r and -P: OK"
