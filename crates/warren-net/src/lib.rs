//! Warren's node-side networking.
//!
//! - [`link`]: a sandbox's interface — a veth pair made with netlink, its sandbox end born in
//!   the sandbox's network namespace and configured there, addresses from the node's pools.
//! - [`nft`]: the node's firewall, one nftables table whose rules never grow per sandbox.
//! - [`nflog`]: the packets the firewall refused, read from its NFLOG group.

pub mod link;
pub mod nflog;
pub mod nft;
