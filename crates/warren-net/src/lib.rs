//! Warren's node-side networking.
//!
//! - [`link`]: a sandbox's interface — a veth pair made with netlink, its sandbox end born in
//!   the sandbox's network namespace and configured there, addresses from the node's pools.
//! - [`nft`]: the node's firewall, one nftables table whose rules never grow per sandbox.
//! - [`nflog`]: the packets the firewall refused, read from its NFLOG group.
//! - [`dns`]: the DNS proxy, each sandbox's only resolver: allowed names only, no rebinding.
//! - [`expose`]: exposed ports, a listener on the node's host per port a sandbox exposes.
//! - [`proxy`]: the transparent proxy for ports 80 and 443 of sandboxes with domain rules:
//!   each connection judged by its TLS server name or HTTP host, and dialled by name.
//! - [`conntrack`]: connection tracking entries of addresses about to be reused, deleted.
//! - [`sockets`]: the closing TCP sockets a finished sandbox's namespace still holds, ended.

pub mod conntrack;
pub mod dns;
pub mod expose;
pub mod link;
mod netlink;
pub mod nflog;
pub mod nft;
pub mod proxy;
pub mod sockets;
