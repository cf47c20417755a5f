//! E2B's egress settings (`allow_internet_access`, `network.allowOut` / `denyOut`) as a
//! Warren network policy.
//!
//! E2B: the internet is open unless denied; `denyOut` lists CIDRs or addresses to refuse
//! (`0.0.0.0/0`, the SDK's `ALL_TRAFFIC`, refuses everything, as `allow_internet_access:
//! false` does); `allowOut` lists CIDRs, addresses and domain names (`*.suffix` too) that win
//! over the denials. Warren: a filtered policy allows nothing but its allow rules, and its deny
//! rules win. So:
//!
//! - everything denied: Warren's allow rules are `allowOut`, its deny rules the other
//!   `denyOut` ranges;
//! - otherwise: the whole internet allowed, `denyOut` denied (`allowOut` adds nothing).
//!
//! Where they part: an `allowOut` entry inside a `denyOut` range stays denied (Warren's deny
//! wins), and names resolve through the node's own resolver (`dnsServers` is not needed and is
//! ignored). The always-denied ranges (the node, the control plane, metadata) stay denied
//! whatever the lists say. Transform rules, egress proxies and the rest are refused.

use serde::Deserialize;
use serde_json::Value;
use warren_sdk::{NetRule, NetworkPolicy};

/// E2B's `network` object (create) and `SandboxNetworkUpdateConfig` (update).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct E2bNetwork {
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    /// The update's own switch (a create has it at the top level).
    #[serde(default)]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    dns_servers: Option<Vec<String>>,
    #[serde(default)]
    egress_proxy: Option<Value>,
    #[serde(default)]
    rules: Option<Value>,
    #[serde(default)]
    mask_request_host: Option<Value>,
    #[serde(default)]
    https_ports: Option<Value>,
    #[serde(default)]
    allow_public_traffic: Option<bool>,
}

/// Most entries in each list.
const MAX_ENTRIES: usize = 256;

fn is_all(entry: &str) -> bool {
    matches!(entry.trim(), "0.0.0.0/0" | "::/0")
}

fn is_address_or_range(entry: &str) -> bool {
    let addr = entry.split_once('/').map_or(entry, |(a, _)| a);
    addr.parse::<std::net::IpAddr>().is_ok()
}

/// The Warren policy for E2B's settings: `internet` is the create's
/// `allow_internet_access` (absent: E2B's default, open), `net` its `network` object.
pub(crate) fn policy(
    internet: Option<bool>,
    net: Option<&E2bNetwork>,
) -> Result<NetworkPolicy, String> {
    let empty = E2bNetwork::default();
    let net = net.unwrap_or(&empty);
    let unsupported = [
        (
            "egressProxy",
            net.egress_proxy.as_ref().is_some_and(|v| !v.is_null()),
        ),
        (
            "rules",
            net.rules
                .as_ref()
                .is_some_and(|v| !v.is_null() && v != &Value::Object(Default::default())),
        ),
        (
            "maskRequestHost",
            net.mask_request_host.as_ref().is_some_and(|v| !v.is_null()),
        ),
        (
            "httpsPorts",
            net.https_ports.as_ref().is_some_and(|v| !v.is_null()),
        ),
        (
            "allowPublicTraffic",
            net.allow_public_traffic == Some(false),
        ),
    ];
    if let Some((name, _)) = unsupported.iter().find(|(_, given)| *given) {
        return Err(format!(
            "network.{name} is not supported by Warren's E2B gateway: leave it out (allowOut, \
             denyOut and allow_internet_access are)"
        ));
    }
    let _ = &net.dns_servers;
    let allow = net.allow_out.clone().unwrap_or_default();
    let deny = net.deny_out.clone().unwrap_or_default();
    if allow.len() > MAX_ENTRIES || deny.len() > MAX_ENTRIES {
        return Err(format!(
            "allowOut and denyOut take {MAX_ENTRIES} entries each at most"
        ));
    }
    if let Some(d) = deny.iter().find(|d| !is_address_or_range(d)) {
        return Err(format!(
            "denyOut entry {d:?} is not an IP address or CIDR (domains may only be allowed)"
        ));
    }
    let deny_all = internet == Some(false)
        || net.allow_internet_access == Some(false)
        || deny.iter().any(|d| is_all(d));
    let deny_rules: Vec<NetRule> = deny
        .iter()
        .filter(|d| !is_all(d))
        .map(|d| NetRule::cidr(d.trim()))
        .collect();
    if deny_all {
        let allow_rules = allow
            .iter()
            .map(|a| {
                let a = a.trim();
                if is_address_or_range(a) {
                    NetRule::cidr(a)
                } else {
                    NetRule::domain(a)
                }
            })
            .collect();
        Ok(NetworkPolicy {
            allow: allow_rules,
            deny: deny_rules,
            ..NetworkPolicy::default()
        })
    } else {
        Ok(NetworkPolicy {
            deny: deny_rules,
            ..NetworkPolicy::internet()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(allow: &[&str], deny: &[&str]) -> E2bNetwork {
        E2bNetwork {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..E2bNetwork::default()
        }
    }

    fn targets(rules: &[NetRule]) -> Vec<String> {
        rules
            .iter()
            .map(|r| r.cidr.clone().or(r.domain.clone()).unwrap_or_default())
            .collect()
    }

    #[test]
    fn e2b_lists_become_warren_policies() {
        // Defaults: the internet.
        let p = policy(None, None).unwrap();
        assert_eq!(targets(&p.allow), ["0.0.0.0/0", "::/0"]);
        assert!(p.deny.is_empty());
        // Off: nothing.
        let p = policy(Some(false), None).unwrap();
        assert!(p.allow.is_empty() && p.deny.is_empty());
        // Everything denied but a list: the list, addresses and names apart.
        let p = policy(
            None,
            Some(&net(
                &["1.2.3.4", "8.8.8.0/24", "*.pypi.org"],
                &["0.0.0.0/0"],
            )),
        )
        .unwrap();
        assert_eq!(targets(&p.allow), ["1.2.3.4", "8.8.8.0/24", "*.pypi.org"]);
        assert_eq!(p.allow[2].domain.as_deref(), Some("*.pypi.org"));
        assert!(p.deny.is_empty());
        // Some ranges denied: the internet but those.
        let p = policy(Some(true), Some(&net(&[], &["203.0.113.0/24"]))).unwrap();
        assert_eq!(targets(&p.allow), ["0.0.0.0/0", "::/0"]);
        assert_eq!(targets(&p.deny), ["203.0.113.0/24"]);
        // The update's own switch.
        let off = E2bNetwork {
            allow_internet_access: Some(false),
            ..net(&["example.com"], &[])
        };
        assert_eq!(
            targets(&policy(None, Some(&off)).unwrap().allow),
            ["example.com"]
        );
    }

    #[test]
    fn what_cannot_be_translated_is_refused() {
        let e = policy(None, Some(&net(&[], &["example.com"]))).unwrap_err();
        assert!(e.contains("not an IP address or CIDR"), "{e}");
        let proxy = E2bNetwork {
            egress_proxy: Some(serde_json::json!({"address": "socks5://x"})),
            ..E2bNetwork::default()
        };
        assert!(
            policy(None, Some(&proxy))
                .unwrap_err()
                .contains("egressProxy")
        );
        let many: Vec<String> = (0..300).map(|i| format!("10.0.{}.0/24", i % 256)).collect();
        let big = E2bNetwork {
            deny_out: Some(many),
            ..E2bNetwork::default()
        };
        assert!(policy(None, Some(&big)).is_err());
    }
}
