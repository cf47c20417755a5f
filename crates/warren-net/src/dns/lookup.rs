//! A name's addresses for the node's own use (the transparent proxy dials what it resolves):
//! one upstream exchange through [`super::upstream`] (fresh id and port), its answer filtered
//! like a sandbox's (the question's CNAME chain only, rebinding addresses set apart).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use hickory_proto::op::{Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use warren_types::net::Cidr;

use super::{message, upstream};

/// What the upstream said a name's addresses of one family are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lookup {
    /// Its addresses outside `never`, in the upstream's order, without duplicates.
    pub addrs: Vec<IpAddr>,
    /// Its addresses inside `never` (rebinding), left out of `addrs`.
    pub dropped: Vec<IpAddr>,
    /// The least TTL of the records kept, seconds (0 without records).
    pub ttl: u32,
}

/// Asks `upstream` for the A (or, with `v6`, AAAA) records of `name` (lower case, no trailing
/// dot) within `timeout`. A name that does not exist, or has no such records, is an empty
/// [`Lookup`]; Err says why there is no answer at all. Forged packets are counted in
/// `spoofed`.
pub(crate) async fn lookup(
    upstream: SocketAddr,
    name: &str,
    v6: bool,
    timeout: Duration,
    never: &[Cidr],
    spoofed: &AtomicU64,
) -> Result<Lookup, String> {
    let mut n = Name::from_ascii(name).map_err(|e| format!("name {name:?}: {e}"))?;
    n.set_fqdn(true);
    let qtype = if v6 { RecordType::AAAA } else { RecordType::A };
    let q = Query::query(n, qtype);
    let m = upstream::resolve(upstream, &q, timeout, spoofed)
        .await
        .map_err(|e| e.to_string())?;
    let rcode = m.metadata.response_code;
    if !matches!(rcode, ResponseCode::NoError | ResponseCode::NXDomain) {
        return Err(format!("the resolver answered {rcode}"));
    }
    let f = message::filter(&q, &m, never, 0, u32::MAX);
    Ok(Lookup {
        addrs: f.addrs,
        dropped: f.dropped,
        ttl: f.ttl,
    })
}
