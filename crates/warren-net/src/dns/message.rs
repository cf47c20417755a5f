//! DNS messages: reading a sandbox's query, building the answers it gets, and filtering the
//! upstream's answer down to the question's CNAME chain and addresses. No I/O, so every rule
//! here is tested without sockets.

use std::collections::HashSet;
use std::net::IpAddr;

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use warren_types::net::Cidr;

/// The EDNS option code of an Extended DNS Error (RFC 8914).
const EDE_OPTION: u16 = 15;
/// Extended DNS Error 18, "Prohibited".
pub(super) const EDE_PROHIBITED: u16 = 18;
/// The text of the Extended DNS Error of a denied name.
pub(super) const EDE_DENIED_TEXT: &str =
    "warren: the sandbox's network policy does not allow this name";

/// The UDP payload the proxy advertises to the upstream: the 2020 DNS flag day's value, which
/// avoids IP fragmentation (and the spoofing of fragments) on any path.
pub(super) const UPSTREAM_UDP_PAYLOAD: u16 = 1232;

/// The longest CNAME chain followed; resolvers stop at about this length too.
const MAX_CHAIN: usize = 16;

/// What a sandbox's message turned out to be.
#[derive(Debug)]
pub(super) enum Parsed {
    /// A query of one question of class IN, EDNS version 0 or no EDNS.
    Query(Message),
    /// Not a query we answer, but with a readable header: this error answer (FORMERR, NOTIMP,
    /// BADVERS) goes back.
    Error(Vec<u8>),
    /// Unreadable, or a response: nothing goes back (answering responses could loop between
    /// two servers, and answering unreadable bytes would give a reflector).
    Drop,
}

/// Reads a sandbox's message.
pub(super) fn parse_query(bytes: &[u8]) -> Parsed {
    let Ok(header) = Header::read(&mut BinDecoder::new(bytes)) else {
        return Parsed::Drop;
    };
    if header.metadata.message_type == MessageType::Response {
        return Parsed::Drop;
    }
    let error = |rcode| match header_error(&header, rcode) {
        Some(b) => Parsed::Error(b),
        None => Parsed::Drop,
    };
    if header.metadata.op_code != OpCode::Query {
        return error(ResponseCode::NotImp);
    }
    // Checked before the full parse, which reserves room for every question the header claims.
    if header.counts.queries != 1 {
        return error(ResponseCode::FormErr);
    }
    let Ok(msg) = Message::from_vec(bytes) else {
        return error(ResponseCode::FormErr);
    };
    let Some(q) = msg.queries.first() else {
        return error(ResponseCode::FormErr);
    };
    if q.query_class() != DNSClass::IN {
        // CHAOS `version.bind` and friends: nothing a sandbox needs, nothing of the node's to
        // tell.
        return error(ResponseCode::NotImp);
    }
    if let Some(e) = &msg.edns
        && e.version() > 0
    {
        // RFC 6891 6.1.3: BADVERS, with an OPT of the version we do speak.
        let mut m = response(&msg, ResponseCode::BADVERS, Vec::new(), 512);
        m.queries.clear();
        return match m.to_vec() {
            Ok(b) => Parsed::Error(b),
            Err(_) => Parsed::Drop,
        };
    }
    Parsed::Query(msg)
}

/// An error answer to a header whose body we did not read: the same id, opcode and RD, no
/// question.
fn header_error(header: &Header, rcode: ResponseCode) -> Option<Vec<u8>> {
    let mut m = Message::error_msg(header.metadata.id, header.metadata.op_code, rcode);
    m.metadata.recursion_desired = header.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.to_vec().ok()
}

/// The question's name as the policy sees it: lower case, no trailing dot. Err (with the
/// name escaped RFC 1035 style, `\DDD`, for the logs) when a label holds anything but letters,
/// digits, `-` and `_`: no policy pattern can match such a name, and a label holding a `.`
/// must not pass for two labels.
pub(super) fn policy_name(name: &Name) -> Result<String, String> {
    let mut out = String::with_capacity(name.len());
    let mut valid = !name.is_root();
    for (i, label) in name.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if label.is_empty() {
            valid = false;
        }
        for &b in label {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                out.push(char::from(b.to_ascii_lowercase()));
            } else {
                valid = false;
                out.push_str(&format!("\\{b:03}"));
            }
        }
    }
    if valid { Ok(out) } else { Err(out) }
}

/// The largest UDP answer the client takes: its EDNS payload size (at least 512, at most
/// `max`), or 512 without EDNS.
pub(super) fn udp_limit(query: &Message, max: usize) -> usize {
    match &query.edns {
        Some(e) => usize::from(e.max_payload()).clamp(512, max.max(512)),
        None => 512,
    }
}

/// An answer to `query` (its id, question, RD and CD bits) with `answers` only: no authority
/// or additional records. It has an OPT (advertising `payload`) when the query had one.
pub(super) fn response(
    query: &Message,
    rcode: ResponseCode,
    answers: Vec<Record>,
    payload: u16,
) -> Message {
    let mut m = Message::response(query.metadata.id, OpCode::Query);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.checking_disabled = query.metadata.checking_disabled;
    m.metadata.response_code = rcode;
    m.queries = query.queries.clone();
    m.answers = answers;
    if query.edns.is_some() {
        let mut e = Edns::new();
        e.set_max_payload(payload);
        m.set_edns(e);
    }
    m
}

/// Adds an Extended DNS Error (RFC 8914) to an answer with an OPT; without one (the query had
/// no EDNS) there is nowhere to put it.
pub(super) fn add_ede(m: &mut Message, code: u16, text: &str) {
    if let Some(e) = m.edns.as_mut() {
        let mut data = code.to_be_bytes().to_vec();
        data.extend_from_slice(text.as_bytes());
        e.options_mut()
            .insert(EdnsOption::Unknown(EDE_OPTION, data));
    }
}

/// Encodes an answer of at most `limit` bytes: the answer, or when it is longer, the same
/// header and question with TC set and no records, so the client asks again over TCP.
pub(super) fn encode(m: &Message, limit: usize) -> Option<Vec<u8>> {
    let bytes = m.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    m.truncate().to_vec().ok().filter(|b| b.len() <= limit)
}

/// The query sent upstream for `q`: a fresh id, RD, EDNS without options (nothing of the
/// sandbox's query but its question travels on: no client subnet, cookies or padding of its
/// choosing).
pub(super) fn upstream_query(id: u16, q: &Query) -> Option<Vec<u8>> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(q.clone());
    let mut e = Edns::new();
    e.set_max_payload(UPSTREAM_UDP_PAYLOAD);
    m.set_edns(e);
    m.to_vec().ok()
}

/// The upstream's answer to the query of `id` and `q`, or None when `bytes` is anything else:
/// another id, another question, not a response, unreadable. Such a packet is ignored, not
/// believed: it may be an off-path spoofer's guess.
pub(super) fn parse_upstream(bytes: &[u8], id: u16, q: &Query) -> Option<Message> {
    // The header first: cheap, and it rejects most guesses before any allocation.
    let header = Header::read(&mut BinDecoder::new(bytes)).ok()?;
    if header.metadata.id != id
        || header.metadata.message_type != MessageType::Response
        || header.metadata.op_code != OpCode::Query
        || header.counts.queries != 1
    {
        return None;
    }
    let m = Message::from_vec(bytes).ok()?;
    let a = m.queries.first()?;
    // Names compare case-insensitively (hickory's `Name` equality).
    let same = a.name() == q.name()
        && a.query_type() == q.query_type()
        && a.query_class() == q.query_class();
    same.then_some(m)
}

/// What is left of an upstream answer for the sandbox.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Filtered {
    /// The CNAME chain from the question's name and the addresses of its names, of the
    /// question's type, TTLs rewritten to `ttl`.
    pub records: Vec<Record>,
    /// The addresses in `records`, without duplicates.
    pub addrs: Vec<IpAddr>,
    /// Addresses dropped as rebinding (inside a `never` CIDR).
    pub dropped: Vec<IpAddr>,
    /// The least TTL of `records`, clamped.
    pub ttl: u32,
}

/// Filters `upstream`'s answer to question `q`: keeps the CNAME chain that starts at the
/// question's name (at most 16 links, no loops) and the records of the question's type (A or
/// AAAA) owned by a name of that chain; drops every other record (records for other names are
/// how caches get poisoned) and every address inside `never`. A CNAME question keeps its
/// first link only. TTLs become the least of those kept, clamped to `[min_ttl, max_ttl]`.
pub(super) fn filter(
    q: &Query,
    upstream: &Message,
    never: &[Cidr],
    min_ttl: u32,
    max_ttl: u32,
) -> Filtered {
    let is_in = |r: &&Record| r.dns_class == DNSClass::IN;
    let mut chain: Vec<&Name> = vec![q.name()];
    let mut records: Vec<Record> = Vec::new();
    let links = if q.query_type() == RecordType::CNAME {
        1
    } else {
        MAX_CHAIN
    };
    for _ in 0..links {
        let Some(current) = chain.last().copied() else {
            break;
        };
        let next = upstream
            .answers
            .iter()
            .filter(is_in)
            .find_map(|r| match &r.data {
                RData::CNAME(CNAME(target)) if &r.name == current => Some((r, target)),
                _ => None,
            });
        let Some((record, target)) = next else {
            break;
        };
        records.push(record.clone());
        if chain.contains(&target) {
            break; // A loop: the link is kept (it is the answer), never followed again.
        }
        chain.push(target);
    }

    let mut out = Filtered::default();
    if matches!(q.query_type(), RecordType::A | RecordType::AAAA) {
        // A set, not `Vec::contains`: a 64 KiB answer holds some 4000 addresses, and whoever
        // serves an allowed zone chooses them.
        let mut seen = HashSet::new();
        for r in upstream.answers.iter().filter(is_in) {
            if !chain.contains(&&r.name) {
                continue;
            }
            let ip = match (&r.data, q.query_type()) {
                (RData::A(A(a)), RecordType::A) => IpAddr::V4(*a),
                (RData::AAAA(AAAA(a)), RecordType::AAAA) => IpAddr::V6(*a),
                _ => continue,
            };
            if !seen.insert(ip) {
                continue;
            }
            if is_never(ip, never) {
                out.dropped.push(ip);
            } else {
                out.addrs.push(ip);
                records.push(r.clone());
            }
        }
    }

    let least = records.iter().map(|r| r.ttl).min().unwrap_or(min_ttl);
    out.ttl = least.clamp(min_ttl, max_ttl);
    for r in &mut records {
        r.ttl = out.ttl;
    }
    out.records = records;
    out
}

/// Whether `ip` is inside one of `never`, or is one that no answer should hold whatever the
/// configuration: "this host" (0.0.0.0/8, `::`, which connect to the host's own loopback on
/// Linux) and IPv4-mapped IPv6 (`::ffff:a.b.c.d`, which an IPv6 socket reaches over IPv4 —
/// past IPv6 rules).
pub(super) fn is_never(ip: IpAddr, never: &[Cidr]) -> bool {
    let builtin = match ip {
        IpAddr::V4(a) => a.octets()[0] == 0,
        IpAddr::V6(a) => a.is_unspecified() || a.to_ipv4_mapped().is_some(),
    };
    builtin || never.iter().any(|c| c.contains(ip))
}

/// An A or AAAA record (for tests and the fake upstream).
#[cfg(test)]
pub(super) fn addr_record(name: &str, ttl: u32, ip: IpAddr) -> Record {
    let data = match ip {
        IpAddr::V4(a) => RData::A(A(a)),
        IpAddr::V6(a) => RData::AAAA(AAAA(a)),
    };
    Record::from_rdata(fqdn(name), ttl, data)
}

/// A CNAME record (for tests and the fake upstream).
#[cfg(test)]
pub(super) fn cname_record(name: &str, ttl: u32, target: &str) -> Record {
    Record::from_rdata(fqdn(name), ttl, RData::CNAME(CNAME(fqdn(target))))
}

/// A fully qualified name from a test's string.
#[cfg(test)]
pub(super) fn fqdn(name: &str) -> Name {
    let mut n = Name::from_ascii(name).expect("a test's name");
    n.set_fqdn(true);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn query_bytes(name: &str, t: RecordType, edns: bool) -> Vec<u8> {
        let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(fqdn(name), t));
        if edns {
            let mut e = Edns::new();
            e.set_max_payload(1232);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    fn answer_of(q: &Query, answers: Vec<Record>) -> Message {
        let mut m = Message::response(1, OpCode::Query);
        m.add_query(q.clone());
        m.answers = answers;
        m
    }

    #[test]
    fn queries_parse_and_errors_keep_the_id() {
        let Parsed::Query(m) = parse_query(&query_bytes("PyPI.org", RecordType::A, true)) else {
            panic!("a plain query");
        };
        assert_eq!(m.queries.len(), 1);
        assert_eq!(policy_name(m.queries[0].name()).unwrap(), "pypi.org");

        assert!(matches!(parse_query(b"\x12"), Parsed::Drop));
        // A response is never answered.
        let mut resp = query_bytes("a.b", RecordType::A, false);
        resp[2] |= 0x80;
        assert!(matches!(parse_query(&resp), Parsed::Drop));

        let rcode_of = |bytes: &[u8]| match parse_query(bytes) {
            Parsed::Error(b) => {
                let m = Message::from_vec(&b).unwrap();
                assert_eq!(m.metadata.id, 0x4242);
                m.metadata.response_code
            }
            other => panic!("{other:?}"),
        };
        // Two questions.
        let mut two = query_bytes("a.b", RecordType::A, false);
        two[5] = 2;
        assert_eq!(rcode_of(&two), ResponseCode::FormErr);
        // A question cut short.
        let full = query_bytes("pypi.org", RecordType::A, false);
        assert_eq!(rcode_of(&full[..full.len() - 3]), ResponseCode::FormErr);
        // Opcode STATUS.
        let mut status = full.clone();
        status[2] = (status[2] & 0x87) | (2 << 3);
        assert_eq!(rcode_of(&status), ResponseCode::NotImp);
        // Class CH.
        let mut ch = full.clone();
        let n = ch.len();
        ch[n - 1] = 3;
        assert_eq!(rcode_of(&ch), ResponseCode::NotImp);
        // EDNS version 1.
        let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(fqdn("a.b"), RecordType::A));
        let mut e = Edns::new();
        e.set_version(1);
        m.set_edns(e);
        // BADVERS is 16, which hickory reads back as BADSIG (they share the number).
        let rcode = rcode_of(&m.to_vec().unwrap());
        assert_eq!((rcode.high(), rcode.low()), (1, 0), "{rcode:?}");
    }

    #[test]
    fn names_with_odd_bytes_cannot_pass_for_others() {
        let one_label = Name::from_labels(vec![b"pypi.org".to_vec()]).unwrap();
        assert_eq!(policy_name(&one_label).unwrap_err(), "pypi\\046org");
        let nul = Name::from_labels(vec![b"a\0".to_vec(), b"com".to_vec()]).unwrap();
        assert_eq!(policy_name(&nul).unwrap_err(), "a\\000.com");
        assert!(policy_name(&Name::root()).is_err());
        assert_eq!(policy_name(&fqdn("_Srv.X-y.COM")).unwrap(), "_srv.x-y.com");
    }

    #[test]
    fn the_chain_and_its_addresses_are_kept_and_everything_else_dropped() {
        let q = Query::query(fqdn("files.pythonhosted.org"), RecordType::A);
        let up = answer_of(
            &q,
            vec![
                cname_record("files.pythonhosted.org", 300, "CDN.example.net"),
                addr_record("cdn.example.net", 30, ip("198.51.100.20")),
                addr_record("cdn.example.net", 40, ip("198.51.100.21")),
                addr_record("cdn.example.net", 30, ip("198.51.100.20")),
                // Not of the chain: a poisoning attempt.
                addr_record("pypi.org", 1000, ip("203.0.113.66")),
                // Not of the question's type.
                addr_record("cdn.example.net", 30, ip("2001:db8::1")),
                // Rebinding.
                addr_record("cdn.example.net", 30, ip("10.200.0.1")),
            ],
        );
        let f = filter(&q, &up, &[cidr("10.200.0.0/16")], 60, 3600);
        assert_eq!(f.addrs, vec![ip("198.51.100.20"), ip("198.51.100.21")]);
        assert_eq!(f.dropped, vec![ip("10.200.0.1")]);
        assert_eq!(f.ttl, 60, "least TTL 30, clamped up to 60");
        assert_eq!(f.records.len(), 3);
        assert!(f.records.iter().all(|r| r.ttl == 60));

        let f = filter(&q, &up, &[], 1, 20);
        assert_eq!(f.ttl, 20, "clamped down to 20");
    }

    #[test]
    fn cname_loops_and_long_chains_end() {
        let q = Query::query(fqdn("a.test"), RecordType::A);
        let looped = answer_of(
            &q,
            vec![
                cname_record("a.test", 60, "b.test"),
                cname_record("b.test", 60, "a.test"),
                addr_record("b.test", 60, ip("198.51.100.1")),
            ],
        );
        let f = filter(&q, &looped, &[], 0, 100);
        assert_eq!(f.records.len(), 3);
        assert_eq!(f.addrs, vec![ip("198.51.100.1")]);

        let mut long = Vec::new();
        for i in 0..40 {
            long.push(cname_record(
                &format!("n{i}.test"),
                60,
                &format!("n{}.test", i + 1),
            ));
        }
        long.push(addr_record("n40.test", 60, ip("198.51.100.2")));
        let q = Query::query(fqdn("n0.test"), RecordType::A);
        let f = filter(&q, &answer_of(&q, long), &[], 0, 100);
        assert_eq!(f.records.len(), MAX_CHAIN);
        assert!(f.addrs.is_empty(), "the chain is cut before its end");

        let q = Query::query(fqdn("a.test"), RecordType::CNAME);
        let f = filter(&q, &looped, &[], 0, 100);
        assert_eq!(
            f.records.len(),
            1,
            "a CNAME question gets its own link only"
        );
        assert!(f.addrs.is_empty());
    }

    #[test]
    fn this_host_and_mapped_addresses_are_always_rebinding() {
        for bad in [
            "0.0.0.0",
            "0.1.2.3",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_never(ip(bad), &[]), "{bad}");
        }
        for good in ["198.51.100.1", "2001:db8::1", "::1"] {
            assert!(!is_never(ip(good), &[]), "{good}");
        }
        assert!(is_never(ip("::1"), &[cidr("::1/128")]));
    }

    #[test]
    fn long_answers_are_truncated_to_the_limit() {
        let Parsed::Query(q) = parse_query(&query_bytes("big.test", RecordType::A, true)) else {
            panic!();
        };
        assert_eq!(udp_limit(&q, 4096), 1232);
        assert_eq!(udp_limit(&q, 1000), 1000);
        let Parsed::Query(plain) = parse_query(&query_bytes("big.test", RecordType::A, false))
        else {
            panic!();
        };
        assert_eq!(udp_limit(&plain, 4096), 512);
        let answers = (0..100)
            .map(|i| addr_record("big.test", 60, IpAddr::from([198, 51, 101, i])))
            .collect();
        let m = response(&q, ResponseCode::NoError, answers, 4096);
        let full = encode(&m, 65535).unwrap();
        assert!(full.len() > 512);
        let cut = Message::from_vec(&encode(&m, 512).unwrap()).unwrap();
        assert!(cut.metadata.truncation);
        assert!(cut.answers.is_empty());
        assert_eq!(cut.queries, q.queries);
        assert!(cut.edns.is_some());
    }

    #[test]
    fn spoofed_upstream_answers_are_not_believed() {
        let q = Query::query(fqdn("pypi.org"), RecordType::A);
        let mut m = Message::response(7, OpCode::Query);
        m.add_query(Query::query(fqdn("PYPI.org"), RecordType::A));
        let good = m.to_vec().unwrap();
        assert!(
            parse_upstream(&good, 7, &q).is_some(),
            "case does not matter"
        );
        assert!(parse_upstream(&good, 8, &q).is_none(), "another id");
        let other = Query::query(fqdn("pypi.org"), RecordType::AAAA);
        assert!(
            parse_upstream(&good, 7, &other).is_none(),
            "another question"
        );
        assert!(parse_upstream(&good[..good.len() - 1], 7, &q).is_none());
        let mut not_response = good.clone();
        not_response[2] &= 0x7f;
        assert!(parse_upstream(&not_response, 7, &q).is_none());
    }
}
