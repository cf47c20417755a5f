//! Warren's node-side networking.
//!
//! - [`link`]: a sandbox's interface — a veth pair made with netlink, its sandbox end born in
//!   the sandbox's network namespace and configured there, addresses from the node's pools.
//! - [`nft`]: the node's firewall, one nftables table whose rules never grow per sandbox.
//! - [`nflog`]: the packets the firewall refused, read from its NFLOG group.
//! - [`dns`]: the DNS proxy, each sandbox's only resolver: allowed names only, no rebinding.
//! - [`conntrack`]: connection tracking entries of addresses about to be reused, deleted.

pub mod conntrack;
pub mod dns;
pub mod link;
pub mod nflog;
pub mod nft;
