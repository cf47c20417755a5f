//! One transaction of element changes, and its writer: an nf_tables netlink batch
//! (`NFNL_MSG_BATCH_BEGIN`, the element messages, `NFNL_MSG_BATCH_END`) sent in one
//! `sendmsg` on a socket the firewall keeps. The kernel applies the batch whole or not at all
//! and answers each message; the first error is reported with the set and element it names.
//!
//! A transaction deletes before it adds, set by set, so an element both deleted and added
//! (a policy replaced by one that shares it, a resolved address refreshed) ends up present.
//! Deletions never fail on a missing element (one that timed out, or that the kernel lost).

use std::collections::BTreeMap;
use std::io;
use std::ops::Range;
use std::time::Duration;

use netlink_packet_core::{
    DefaultNla, Emitable, ErrorBuffer, NLA_TYPE_MASK, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED,
    NLM_F_CREATE, NLM_F_REQUEST, NLMSG_ERROR, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, Nla, NlasIterator,
};
use netlink_packet_netfilter::nftables::{
    ListAttribute, NfTablesMessage, SetElementAttribute, SetElementList, SetElementMessage,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{Socket, constants::NETLINK_NETFILTER};
use rustix::io::Errno;
use rustix::net::sockopt;

use super::TABLE;
use super::element::{Element, Field, IfName, Set};

/// `NFNL_SUBSYS_NFTABLES`: the subsystem a batch is for (its begin message's `res_id`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFT_MSG_DESTROYSETELEM` (Linux 6.3): a deletion that ignores a missing element.
const NFT_MSG_DESTROYSETELEM: u8 = 30;
/// `NFTA_SET_ELEM_LIST_ELEMENTS`.
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
/// Extended ack attributes: the kernel's message, and the offset of the attribute at fault.
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLMSGERR_ATTR_OFFS: u16 = 2;
/// The netlink and nfnetlink headers before a message's attributes.
const HEADERS: usize = 16 + 4;

/// Bytes of elements per message: well below the 64 KiB a nested attribute's 16-bit length
/// allows.
const ELEMENTS_PER_MESSAGE: usize = 32 * 1024;
/// Batches of up to this many messages ask an ack of each; a larger one asks it of its last
/// message only (the kernel reports every failing message regardless), so the answers to one
/// batch always fit the socket's receive buffer.
const ACK_EACH: usize = 256;
/// The receive buffer: answers are acks and errors (with capped payloads), never large.
const ANSWERS: usize = 64 * 1024;
/// The kernel answers a batch before `sendmsg` returns; this only bounds a wait that should
/// never happen.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// One transaction: elements to delete and to add, per set.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    destroy: BTreeMap<Set, Vec<Element>>,
    pub(super) add: BTreeMap<Set, Vec<Element>>,
}

impl Batch {
    /// Adds `e` to `set` (no error if it is there already, as `nft add element`).
    pub(crate) fn add(&mut self, set: Set, e: Element) {
        self.add.entry(set).or_default().push(e);
    }

    /// Deletes `e` from `set` (no error if it is not there). Before every addition.
    pub(crate) fn destroy(&mut self, set: Set, e: Element) {
        self.destroy.entry(set).or_default().push(e);
    }

    /// Whether it changes nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.destroy.is_empty() && self.add.is_empty()
    }

    /// The same transaction in nft's text. A deletion is written as an addition followed by
    /// a deletion, so that it cannot fail on a missing element (`nft destroy` is newer than
    /// some nft binaries).
    pub(crate) fn script(&self) -> String {
        let mut s = String::new();
        let mut line = |verb: &str, set: Set, chunk: &[Element], key_only: bool| {
            let v: Vec<String> = chunk
                .iter()
                .map(|e| {
                    if key_only {
                        e.key_text()
                    } else {
                        e.to_string()
                    }
                })
                .collect();
            s.push_str(&format!(
                "{verb} element inet {TABLE} {set} {{ {} }}\n",
                v.join(", ")
            ));
        };
        for (set, els) in &self.destroy {
            for chunk in els.chunks(1024) {
                line("add", *set, chunk, false);
                line("delete", *set, chunk, true);
            }
        }
        for (set, els) in &self.add {
            for chunk in els.chunks(1024) {
                line("add", *set, chunk, false);
            }
        }
        s
    }
}

/// What one message of a batch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `NFT_MSG_NEWSETELEM` of the batch's additions.
    Add,
    /// `NFT_MSG_DESTROYSETELEM` of its deletions.
    Destroy,
    /// `NFT_MSG_NEWSETELEM` of its deletions, before `Delete` (kernels before 6.3).
    Ensure,
    /// `NFT_MSG_DELSETELEM` of its deletions (kernels before 6.3).
    Delete,
}

/// A message of a batch: which elements of which set, and where its bytes are.
#[derive(Debug)]
struct Sent {
    seq: u32,
    set: Set,
    op: Op,
    /// Its elements, in the batch's list for `set` (additions or deletions, by `op`).
    elements: Range<usize>,
    /// Its bytes in the batch.
    bytes: Range<usize>,
}

/// The kernel's answer to a failed batch.
#[derive(Debug)]
struct Refusal {
    seq: u32,
    errno: i32,
    /// The offset in the message of the attribute at fault (extended ack).
    offset: Option<usize>,
    /// The kernel's explanation (extended ack).
    text: Option<String>,
}

enum Failure {
    /// The kernel refused the batch: its errno, and the error that names the element.
    Refused(i32, io::Error),
    Io(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Io(e)
    }
}

/// A netlink socket to nf_tables, in the network namespace of the thread that opened it.
pub(crate) struct Netlink {
    socket: Socket,
    seq: u32,
    /// Whether the kernel has `NFT_MSG_DESTROYSETELEM`.
    destroy: bool,
    /// The socket's send buffer: a batch is one message and must fit.
    sndbuf: usize,
    answers: Vec<u8>,
}

impl Netlink {
    /// Opens the socket and learns whether the kernel can destroy elements.
    pub(crate) fn open() -> io::Result<Netlink> {
        let mut socket = Socket::new(NETLINK_NETFILTER)
            .map_err(|e| io::Error::new(e.kind(), format!("opening an nf_tables socket: {e}")))?;
        socket.bind_auto()?;
        // Errors without a copy of the failed message (it could be 32 KiB), but with the
        // offset of the element at fault.
        socket.set_cap_ack(true)?;
        socket.set_ext_ack(true)?;
        let _ = socket.set_rx_buf_sz(1 << 20);
        sockopt::set_socket_timeout(&socket, sockopt::Timeout::Recv, Some(ANSWER_TIMEOUT))?;
        let sndbuf = sockopt::socket_send_buffer_size(&socket)?;
        let mut nl = Netlink {
            socket,
            seq: 0,
            destroy: true,
            sndbuf,
            answers: vec![0; ANSWERS],
        };
        nl.destroy = nl.probe_destroy()?;
        Ok(nl)
    }

    /// Whether the kernel knows `NFT_MSG_DESTROYSETELEM` (Linux 6.3 and later), tried on an
    /// element no interface is named after. An older kernel refuses the unknown message type
    /// (EINVAL, or EOPNOTSUPP); there a deletion is written as an addition of the same
    /// element followed by `NFT_MSG_DELSETELEM`, which cannot fail on a missing element
    /// either.
    fn probe_destroy(&mut self) -> io::Result<bool> {
        let mut b = Batch::default();
        b.destroy(Set::Gen, Element::new(vec![Field::Iface(IfName::new(""))]));
        match self.transact(&b, true) {
            Ok(()) => Ok(true),
            // No table yet: the message type was understood.
            Err(Failure::Refused(e, _)) if e == Errno::NOENT.raw_os_error() => Ok(true),
            Err(Failure::Refused(e, _))
                if e == Errno::INVAL.raw_os_error() || e == Errno::OPNOTSUPP.raw_os_error() =>
            {
                Ok(false)
            }
            Err(Failure::Refused(_, e) | Failure::Io(e)) => Err(e),
        }
    }

    /// Whether deletions use `NFT_MSG_DESTROYSETELEM`.
    pub(crate) fn destroys(&self) -> bool {
        self.destroy
    }

    /// Deletes as on a kernel before 6.3 (to test that way on a newer one).
    #[cfg(test)]
    pub(crate) fn as_before_destroy(&mut self) {
        self.destroy = false;
    }

    /// Applies `batch` in one transaction: all of it, or nothing and an error naming the
    /// set and element the kernel refused.
    pub(crate) fn commit(&mut self, batch: &Batch) -> io::Result<()> {
        match self.transact(batch, self.destroy) {
            Ok(()) => Ok(()),
            Err(Failure::Refused(_, e) | Failure::Io(e)) => Err(e),
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn transact(&mut self, batch: &Batch, destroy: bool) -> Result<(), Failure> {
        if batch.is_empty() {
            return Ok(());
        }
        let (bytes, sent, begin) = self.encode(batch, destroy);
        self.send(&bytes)?;
        let last = sent.last().map_or(begin, |s| s.seq);
        match self.answers(begin, last)? {
            None => Ok(()),
            Some(r) => Err(Failure::Refused(r.errno, describe(batch, &sent, &bytes, r))),
        }
    }

    /// The batch's bytes, its element messages, and the sequence number of its beginning.
    /// Each message is written as soon as its elements are encoded, so a large transaction
    /// holds its bytes and one message's elements, no more.
    fn encode(&mut self, batch: &Batch, destroy: bool) -> (Vec<u8>, Vec<Sent>, u32) {
        let mut bytes = Vec::new();
        let batch_header =
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES);
        let begin = self.next_seq();
        push(
            &mut bytes,
            begin,
            NLM_F_REQUEST,
            batch_header.clone(),
            ControlMessage::BatchBegin,
        );
        let mut sent = Vec::new();
        let mut message = |nl: &mut Netlink, set, op, elements, attrs| {
            let seq = nl.next_seq();
            let mut flags = NLM_F_REQUEST | NLM_F_ACK;
            if matches!(op, Op::Add | Op::Ensure) {
                flags |= NLM_F_CREATE;
            }
            let at = push(
                &mut bytes,
                seq,
                flags,
                NetfilterHeader::new(NetfilterProtoFamily::Inet, 0, 0),
                element_message(set, op, attrs),
            );
            sent.push(Sent {
                seq,
                set,
                op,
                elements,
                bytes: at,
            });
        };
        for (&set, els) in &batch.destroy {
            for (range, attrs) in Chunks::new(set, els, !destroy) {
                if destroy {
                    message(self, set, Op::Destroy, range, attrs);
                } else {
                    let keys = els[range.clone()]
                        .iter()
                        .map(|e| ListAttribute::Element(e.attributes(set, false)))
                        .collect();
                    message(self, set, Op::Ensure, range.clone(), attrs);
                    message(self, set, Op::Delete, range, keys);
                }
            }
        }
        for (&set, els) in &batch.add {
            for (range, attrs) in Chunks::new(set, els, true) {
                message(self, set, Op::Add, range, attrs);
            }
        }
        // A large batch asks an ack of its last message only.
        if sent.len() > ACK_EACH {
            for s in &sent[..sent.len() - 1] {
                let mut m = NetlinkBuffer::new(&mut bytes[s.bytes.clone()]);
                let flags = m.flags();
                m.set_flags(flags & !NLM_F_ACK);
            }
        }
        let end = self.next_seq();
        push(
            &mut bytes,
            end,
            NLM_F_REQUEST,
            batch_header,
            ControlMessage::BatchEnd,
        );
        (bytes, sent, begin)
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        // The kernel takes a message only if it fits the send buffer.
        if bytes.len() + 64 > self.sndbuf {
            let want = bytes.len() + (64 << 10);
            // SO_SNDBUFFORCE passes net.core.wmem_max; it needs CAP_NET_ADMIN, which nf_tables
            // needs anyway.
            if sockopt::set_socket_send_buffer_size_force(&self.socket, want).is_err() {
                sockopt::set_socket_send_buffer_size(&self.socket, want)?;
            }
            self.sndbuf = sockopt::socket_send_buffer_size(&self.socket)?;
            if bytes.len() + 64 > self.sndbuf {
                return Err(io::Error::other(format!(
                    "nf_tables: a transaction of {} bytes does not fit the socket's send buffer \
                     ({} bytes): raise net.core.wmem_max",
                    bytes.len(),
                    self.sndbuf
                )));
            }
        }
        let n = self.socket.send(bytes, 0)?;
        if n != bytes.len() {
            return Err(io::Error::other(format!(
                "nf_tables: sent {n} of a transaction's {} bytes",
                bytes.len()
            )));
        }
        Ok(())
    }

    /// Reads the answers to the batch whose messages are numbered `begin..=last`, until the
    /// last one's (the kernel answers in order) or an error about the whole batch; returns
    /// the first error. Answers to earlier batches are skipped.
    fn answers(&mut self, begin: u32, last: u32) -> io::Result<Option<Refusal>> {
        let mut first: Option<Refusal> = None;
        loop {
            let n = match crate::netlink::recv(
                &self.socket,
                &mut self.answers,
                "nf_tables (a transaction)",
                ANSWER_TIMEOUT.as_secs(),
            ) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(Errno::NOBUFS.raw_os_error()) => {
                    return Err(io::Error::other(
                        "nf_tables: the kernel's answers to a transaction overflowed the \
                         socket's receive buffer, so whether it was applied is unknown",
                    ));
                }
                Err(e) => return Err(e),
            };
            let mut off = 0;
            let mut done = false;
            while off < n {
                let Ok(m) = NetlinkBuffer::new_checked(&self.answers[off..n]) else {
                    break;
                };
                let len = m.length() as usize;
                let seq = m.sequence_number();
                let ours = seq.wrapping_sub(begin) <= last.wrapping_sub(begin);
                if m.message_type() == NLMSG_ERROR
                    && ours
                    && let Ok(e) = ErrorBuffer::new_checked(m.payload())
                {
                    let code = e.code();
                    if let Some(c) = code
                        && first.is_none()
                    {
                        first = Some(refusal(seq, -c.get(), m.flags(), m.payload()));
                    }
                    if seq == last || (seq == begin && code.is_some()) {
                        done = true;
                    }
                }
                if len == 0 {
                    break;
                }
                off += align(len);
            }
            if done {
                return Ok(first);
            }
        }
    }
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// The elements of `els` as list attributes, in runs that fit one message each, one run at
/// a time.
struct Chunks<'a> {
    set: Set,
    els: &'a [Element],
    /// Whole elements (additions) or keys only (deletions).
    whole: bool,
    next: usize,
}

impl<'a> Chunks<'a> {
    fn new(set: Set, els: &'a [Element], whole: bool) -> Chunks<'a> {
        Chunks {
            set,
            els,
            whole,
            next: 0,
        }
    }
}

impl Iterator for Chunks<'_> {
    type Item = (Range<usize>, Vec<ListAttribute<SetElementAttribute>>);

    fn next(&mut self) -> Option<Self::Item> {
        let start = self.next;
        let mut v = Vec::new();
        let mut size = 0;
        while let Some(e) = self.els.get(self.next) {
            let a = ListAttribute::Element(e.attributes(self.set, self.whole));
            let n = a.buffer_len();
            if !v.is_empty() && size + n > ELEMENTS_PER_MESSAGE {
                break;
            }
            size += n;
            v.push(a);
            self.next += 1;
        }
        (!v.is_empty()).then_some((start..self.next, v))
    }
}

fn element_message(
    set: Set,
    op: Op,
    elements: Vec<ListAttribute<SetElementAttribute>>,
) -> NfTablesMessage {
    let attributes = vec![
        SetElementList::Table(TABLE.into()),
        SetElementList::Set(set.name().into()),
        SetElementList::Elements(elements),
    ];
    match op {
        Op::Add | Op::Ensure => NfTablesMessage::NewSetElement(SetElementMessage { attributes }),
        Op::Delete => NfTablesMessage::DeleteSetElement(SetElementMessage { attributes }),
        // netlink-packet-netfilter 0.4 has no type for it: the same attributes, as they are.
        Op::Destroy => NfTablesMessage::Other {
            message_type: NFT_MSG_DESTROYSETELEM,
            attributes: attributes.iter().map(opaque).collect(),
        },
    }
}

/// An attribute as its kind and bytes.
fn opaque(a: &SetElementList) -> DefaultNla {
    let mut v = vec![0; a.value_len()];
    a.emit_value(&mut v);
    DefaultNla::new(a.kind(), v)
}

/// Appends one message; returns where its bytes are.
fn push(
    bytes: &mut Vec<u8>,
    seq: u32,
    flags: u16,
    header: NetfilterHeader,
    inner: impl Into<NetfilterMessageInner>,
) -> Range<usize> {
    let mut h = NetlinkHeader::default();
    h.flags = flags;
    h.sequence_number = seq;
    let mut m = NetlinkMessage::new(
        h,
        NetlinkPayload::InnerMessage(NetfilterMessage::new(header, inner)),
    );
    m.finalize();
    let start = bytes.len();
    bytes.resize(start + m.buffer_len(), 0);
    m.serialize(&mut bytes[start..]);
    start..bytes.len()
}

/// An error answer: the errno and, with an extended ack, the kernel's text and the offset of
/// the attribute at fault.
fn refusal(seq: u32, errno: i32, flags: u16, payload: &[u8]) -> Refusal {
    let mut r = Refusal {
        seq,
        errno,
        offset: None,
        text: None,
    };
    if flags & NLM_F_ACK_TLVS == 0 {
        return r;
    }
    // The error code, then the request's header (alone when capped) or all of it.
    let request = if flags & NLM_F_CAPPED != 0 {
        16
    } else {
        payload.get(4..8).map_or(16, |b| {
            u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize
        })
    };
    let Some(tlvs) = payload.get(4 + align(request)..) else {
        return r;
    };
    for nla in NlasIterator::new(tlvs).map_while(Result::ok) {
        let v = nla.value();
        match nla.kind() & NLA_TYPE_MASK {
            NLMSGERR_ATTR_MSG => {
                let t = String::from_utf8_lossy(v);
                r.text = Some(t.trim_end_matches('\0').to_string());
            }
            NLMSGERR_ATTR_OFFS if v.len() >= 4 => {
                r.offset = Some(u32::from_ne_bytes([v[0], v[1], v[2], v[3]]) as usize);
            }
            _ => {}
        }
    }
    r
}

/// The index, among its message's elements, of the element whose bytes hold `offset`.
fn element_at(message: &[u8], offset: usize) -> Option<usize> {
    let mut pos = HEADERS;
    for nla in NlasIterator::new(message.get(HEADERS..)?).map_while(Result::ok) {
        if nla.kind() & NLA_TYPE_MASK == NFTA_SET_ELEM_LIST_ELEMENTS {
            let mut p = pos + 4;
            for (i, e) in NlasIterator::new(nla.value())
                .map_while(Result::ok)
                .enumerate()
            {
                let len = usize::from(e.length());
                if (p..p + len).contains(&offset) {
                    return Some(i);
                }
                p += align(len);
            }
        }
        pos += align(usize::from(nla.length()));
    }
    None
}

/// The refusal as an error that names the set and element.
fn describe(batch: &Batch, sent: &[Sent], bytes: &[u8], r: Refusal) -> io::Error {
    let err = io::Error::from_raw_os_error(r.errno);
    let why = r.text.map(|t| format!(" ({t})")).unwrap_or_default();
    let Some(s) = sent.iter().find(|s| s.seq == r.seq) else {
        return io::Error::new(
            err.kind(),
            format!("nf_tables refused the transaction: {err}{why}"),
        );
    };
    let adding = s.op == Op::Add;
    let list = if adding { &batch.add } else { &batch.destroy };
    let els = list.get(&s.set).map_or(&[][..], |v| &v[s.elements.clone()]);
    let what = match r
        .offset
        .and_then(|o| element_at(&bytes[s.bytes.clone()], o))
        .and_then(|i| els.get(i))
    {
        Some(e) if adding => format!("element {e}"),
        Some(e) => format!("element {}", e.key_text()),
        None if els.len() == 1 => format!("element {}", els[0].key_text()),
        None => format!(
            "{} elements (the first {})",
            els.len(),
            els.first().map(Element::key_text).unwrap_or_default()
        ),
    };
    let (verb, prep) = match s.op {
        Op::Add | Op::Ensure => ("adding", "to"),
        Op::Destroy | Op::Delete => ("deleting", "from"),
    };
    io::Error::new(
        err.kind(),
        format!(
            "nf_tables: {verb} {what} {prep} set inet {TABLE} {}: {err}{why}",
            s.set
        ),
    )
}
