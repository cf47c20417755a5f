//! Warren's node-side networking.
//!
//! - [`link`]: a sandbox's interface — a veth pair made with netlink, one end moved into the
//!   sandbox's network namespace and configured there, addresses from the node's pool.
pub mod link;
