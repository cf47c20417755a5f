//! Warren's node-side networking.
//!
//! - [`link`]: a sandbox's interface — a veth pair made with netlink, one end moved into the
//!   sandbox's network namespace and configured there, addresses from the node's pool.
//! - [`dns`]: the DNS proxy, each sandbox's only resolver: allowed names only, no rebinding.
pub mod dns;
pub mod link;
