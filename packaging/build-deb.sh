#!/usr/bin/env bash
# Builds the proxops .deb: the binary, then the assets generated from it and from
# agent.toml.example (so they never drift from the code), then `cargo deb --no-build`.
# Prints the path of the .deb on the last line. Needs cargo-deb (installed if missing).
#
# The profile is `release`, except in CI (CI=true), where the package is built only to be
# checked and `deb-ci` (Cargo.toml: opt-level 1, no debug info, 256 codegen units) builds in
# a fraction of the time. PROXOPS_DEB_PROFILE overrides both. cargo-deb resolves the
# `target/release/` asset paths of [package.metadata.deb] to the chosen profile's directory.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${CI:-}" == "true" ]]; then
  profile="${PROXOPS_DEB_PROFILE:-deb-ci}"
else
  profile="${PROXOPS_DEB_PROFILE:-release}"
fi
target="${CARGO_TARGET_DIR:-target}"
assets="$target/$profile/proxops-assets"

if ! cargo deb --version >/dev/null 2>&1; then
  cargo install cargo-deb --locked
fi

echo "build-deb: profile $profile" >&2
cargo build --profile "$profile" --locked -p proxops --bin proxops
bin="$target/$profile/proxops"

rm -rf "$assets"
mkdir -p "$assets/man"
# The default /etc/proxops/agent.toml: the example with its [section] headers commented too,
# so the installed file parses and sets nothing until the operator edits it.
{
  echo "# Installed by the proxops package; edit it, dpkg keeps your changes on upgrade."
  echo "# The same file with notes: /usr/share/doc/proxops/examples/agent.toml.example"
  echo "# Operations guide: /usr/share/doc/proxops/operations.md"
  sed -E 's/^\[/# [/' agent.toml.example
} >"$assets/agent.toml"
"$bin" completions bash >"$assets/proxops.bash"
"$bin" completions zsh >"$assets/_proxops"
"$bin" completions fish >"$assets/proxops.fish"
"$bin" man --dir "$assets/man"
gzip -9n "$assets"/man/*.1

# `release` is already stripped (Cargo.toml `strip = true`); `--strip` is kept for profiles
# that are not (PROXOPS_DEB_PROFILE=bench keeps symbols).
cargo deb --locked --no-build --strip --profile "$profile" -p proxops 2>&1 | tee "$assets/cargo-deb.log" >&2
tail -n 1 "$assets/cargo-deb.log"
