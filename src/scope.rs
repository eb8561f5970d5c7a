//! The operator's `[scope]` in the one pipeline: [`check_revision`] refuses a desired state
//! outside it (`proxops_core::scope::check`, then the artifact hosts resolved here, at plan
//! and apply time). `validate` runs the static part ([`proxops_core::scope::check`]) only.
//!
//! Resolution uses the system resolver (tokio's `lookup_host`, so `/etc/hosts` counts), with
//! [`RESOLVE_TIMEOUT`] per host. This node's own addresses are read from
//! `/proc/net/fib_trie` (IPv4 `LOCAL` routes) and `/proc/net/if_inet6`, so a host that
//! resolves to one of them is refused even when it is public.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use proxops_core::diagnostic::Diagnostic;
use proxops_core::manifest::Spec;
use proxops_core::repository::DesiredState;
use proxops_core::scope::{self, Scope};

/// How long one artifact host may take to resolve.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Every problem of `desired` against `scope`: the static checks, then each artifact host
/// (not listed in `artifact_hosts`) resolved and refused when it reaches an internal address,
/// an address of this node, or does not resolve. Empty when the revision may be planned.
pub async fn check_revision(
    scope: &Scope,
    desired: &DesiredState,
    files: &BTreeMap<String, String>,
) -> Vec<Diagnostic> {
    let mut problems = scope::check(scope, desired, files);
    if scope.artifact_hosts.is_none() {
        let answers = resolve_hosts(desired).await;
        let own = own_addresses();
        problems.extend(scope::check_hosts(scope, desired, files, &own, |host| {
            answers
                .get(&host.to_ascii_lowercase())
                .cloned()
                .unwrap_or_else(|| Err("not resolved".to_owned()))
        }));
    }
    proxops_core::diagnostic::sort_diagnostics(&mut problems);
    problems
}

/// The addresses of every artifact host name (IP literals are checked without resolving).
async fn resolve_hosts(desired: &DesiredState) -> BTreeMap<String, Result<Vec<IpAddr>, String>> {
    let hosts: BTreeSet<String> = desired
        .manifest
        .resources()
        .filter_map(|r| match &r.spec {
            Some(Spec::Artifact(a)) => scope::url_host(&a.url).map(str::to_ascii_lowercase),
            _ => None,
        })
        .filter(|host| host.parse::<IpAddr>().is_err())
        .collect();
    let mut answers = BTreeMap::new();
    for host in hosts {
        let answer = match tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tokio::net::lookup_host((host.as_str(), 0)),
        )
        .await
        {
            Err(_) => Err(format!("no answer within {} s", RESOLVE_TIMEOUT.as_secs())),
            Ok(Err(error)) => Err(error.to_string()),
            Ok(Ok(addresses)) => {
                let addresses: Vec<IpAddr> = addresses.map(|a| a.ip()).collect();
                if addresses.is_empty() {
                    Err("no address".to_owned())
                } else {
                    Ok(addresses)
                }
            }
        };
        answers.insert(host, answer);
    }
    answers
}

/// This node's own addresses (empty where `/proc` does not tell).
pub fn own_addresses() -> Vec<IpAddr> {
    let mut own = Vec::new();
    if let Ok(trie) = std::fs::read_to_string("/proc/net/fib_trie") {
        own.extend(local_ipv4(&trie));
    }
    if let Ok(table) = std::fs::read_to_string("/proc/net/if_inet6") {
        own.extend(table.lines().filter_map(ipv6_of_line));
    }
    own.sort();
    own.dedup();
    own
}

/// The addresses of `/proc/net/fib_trie` with a `host LOCAL` route: this host's IPv4 ones.
fn local_ipv4(trie: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut last: Option<IpAddr> = None;
    for line in trie.lines() {
        let line = line.trim_start_matches([' ', '|', '+', '-']);
        if let Ok(address) = line.trim().parse::<IpAddr>() {
            last = Some(address);
        } else if line.contains("host LOCAL") {
            out.extend(last);
        }
    }
    out
}

/// The address of one `/proc/net/if_inet6` line (32 hex digits first).
fn ipv6_of_line(line: &str) -> Option<IpAddr> {
    let hex = line.split_whitespace().next()?;
    let bits = u128::from_str_radix(hex, 16).ok()?;
    (hex.len() == 32).then(|| IpAddr::V6(Ipv6Addr::from(bits)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_routes_of_fib_trie_are_this_nodes_ipv4_addresses() {
        let trie = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     +-- 10.0.0.0/24 2 0 2\n        |-- 10.0.0.0\n           /24 link UNICAST\n        |-- 10.0.0.7\n           /32 host LOCAL\n";
        assert_eq!(local_ipv4(trie), ["10.0.0.7".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn an_if_inet6_line_gives_its_address() {
        let line = "fe800000000000000000000000000001 02 40 20 80 eth0";
        assert_eq!(ipv6_of_line(line), Some("fe80::1".parse().unwrap()));
        assert_eq!(ipv6_of_line("zz"), None);
    }

    #[test]
    fn this_node_has_at_least_its_loopback_address_when_proc_tells() {
        if std::path::Path::new("/proc/net/fib_trie").exists() {
            assert!(own_addresses().contains(&"127.0.0.1".parse().unwrap()));
        }
    }
}
