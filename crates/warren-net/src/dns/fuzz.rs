//! Entry point for the fuzz targets (`fuzz/` at the top of the repository, not an API): a
//! message read as the proxy reads a sandbox's query (and answers it), and the same bytes as
//! an upstream's answer (read, checked against the question, filtered).

use std::net::IpAddr;

use hickory_proto::op::{Header, Message, ResponseCode};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use warren_types::net::Cidr;

use super::message::{self, Parsed};

/// The UDP payload the proxy advertises by default.
const PAYLOAD: u16 = 1232;

/// `data` as a sandbox's query, then as an upstream's answer to its own question.
pub fn message(data: &[u8]) {
    match message::parse_query(data) {
        Parsed::Query(query) => {
            let q = query
                .queries
                .first()
                .expect("a parsed query has its question");
            let _ = message::policy_name(q.name());
            let limit = message::udp_limit(&query, usize::from(PAYLOAD));
            assert!((512..=usize::from(PAYLOAD)).contains(&limit));
            for rcode in [
                ResponseCode::Refused,
                ResponseCode::NXDomain,
                ResponseCode::NotImp,
                ResponseCode::NoError,
                ResponseCode::ServFail,
            ] {
                let mut m = message::response(&query, rcode, Vec::new(), PAYLOAD);
                if rcode == ResponseCode::NXDomain {
                    message::add_ede(&mut m, message::EDE_PROHIBITED, message::EDE_DENIED_TEXT);
                }
                if let Some(b) = message::encode(&m, limit) {
                    assert!(b.len() <= limit, "an answer over the client's limit");
                }
            }
            // What goes upstream is the question alone, and is no answer to itself.
            if let Some(up) = message::upstream_query(7, q) {
                assert!(message::parse_upstream(&up, 7, q).is_none());
            }
        }
        Parsed::Error(b) => {
            let h = Header::read(&mut BinDecoder::new(&b)).expect("an error answer reads back");
            let asked = Header::read(&mut BinDecoder::new(data)).expect("a readable header");
            assert_eq!(h.metadata.id, asked.metadata.id);
        }
        Parsed::Drop => {}
    }

    let Ok(header) = Header::read(&mut BinDecoder::new(data)) else {
        return;
    };
    let Some(q) = Message::from_vec(data)
        .ok()
        .and_then(|m| m.queries.into_iter().next())
    else {
        return;
    };
    let Some(up) = message::parse_upstream(data, header.metadata.id, &q) else {
        return;
    };
    let never: Vec<Cidr> = [
        "10.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "fc00::/7",
        "::1/128",
    ]
    .iter()
    .map(|c| Cidr::parse(c).expect("a CIDR"))
    .collect();
    let f = message::filter(&q, &up, &never, 1, 300);
    assert!(
        f.addrs
            .iter()
            .all(|&ip: &IpAddr| !message::is_never(ip, &never))
    );
    assert!(f.records.len() <= up.answers.len());
    assert!(f.records.iter().all(|r| r.ttl == f.ttl) && (1..=300).contains(&f.ttl));
    let m = message::response(&up, up.metadata.response_code, f.records, PAYLOAD);
    if let Some(b) = message::encode(&m, 512) {
        assert!(b.len() <= 512);
    }
}
