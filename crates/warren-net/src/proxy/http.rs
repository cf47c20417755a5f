//! Plain HTTP/1 on a redirected connection: the host each request names, and the framing of
//! its body, so that every later request on the connection is found and held to the first
//! one's host. No I/O.
//!
//! The rule: a connection serves one host. Its first request's host (the Host header, or the
//! authority of an absolute-form target; both present, they must agree) is the one the policy
//! judges and the proxy dials; a later request naming another host cuts the connection (it
//! would reach the first host's server, which may serve the other name too: virtual hosts
//! on one address are what domain rules must tell apart). Bodies are followed by their
//! `Content-Length` or chunked `Transfer-Encoding` (RFC 9112 §6), strictly: both at once, any
//! other transfer coding, differing lengths, bare LF in chunk lines — whatever two parsers
//! could read two ways — is refused, so a request cannot hide inside another's body. After a
//! request asking to `Upgrade` (WebSocket, h2c) the connection is passed through unread.

use httparse::Status;

use super::Refusal;
use super::name;

/// Header fields read in one head; more is refused.
const MAX_HEADERS: usize = 100;
/// The longest chunk-size line (with its extensions).
const MAX_CHUNK_LINE: usize = 1024;
/// Hex digits of a chunk size (15: it fits in 60 bits).
const MAX_CHUNK_DIGITS: u8 = 15;

/// What a request's head says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Head {
    /// The host it names, normalised, without its port.
    pub name: String,
    /// What follows it.
    pub framing: Framing,
}

/// What follows a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// Nothing: the next request's head.
    Empty,
    /// A body of this many bytes.
    Length(u64),
    /// A chunked body.
    Chunked,
    /// Anything: the request asks to change protocols, so nothing more is read.
    Opaque,
}

/// The length of the request head at the start of `buf` — through the empty line that ends
/// it, empty lines before the request line included (RFC 9112 §2.2) — if it is all there.
/// `from`: how much of `buf` an earlier call saw (its search resumes there).
pub(super) fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let lead = buf
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    let start = lead.max(from.saturating_sub(3));
    let mut i = start;
    while let Some(off) = buf.get(i..)?.iter().position(|&b| b == b'\n') {
        let nl = i + off;
        let after = buf.get(nl + 1..).unwrap_or_default();
        if after.first() == Some(&b'\n') {
            return Some(nl + 2);
        }
        if after.starts_with(b"\r\n") {
            return Some(nl + 3);
        }
        i = nl + 1;
    }
    None
}

/// Reads a complete request head (what [`head_end`] measured).
pub(super) fn parse_head(head: &[u8]) -> Result<Head, Refusal> {
    let lead = head
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(head.get(lead..).unwrap_or_default()) {
        Ok(Status::Complete(_)) => {}
        Ok(Status::Partial) => return Err(Refusal::Malformed("an HTTP request head cut short")),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::Malformed(
                "an HTTP request of over 100 header fields",
            ));
        }
        Err(_) => return Err(Refusal::Malformed("not an HTTP/1 request")),
    }
    if req
        .method
        .is_some_and(|m| m.eq_ignore_ascii_case("CONNECT"))
    {
        return Err(Refusal::Tunnel);
    }
    let headers: &[httparse::Header<'_>] = req.headers;
    let named = |n: &'static str| {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(n))
    };
    let mut hosts = named("host");
    let host_field = hosts.next();
    if hosts.next().is_some() {
        return Err(Refusal::Malformed("an HTTP request with two Host fields"));
    }
    let from_field = host_field.map(|h| host_name(h.value)).transpose()?;
    let target = req.path.unwrap_or_default();
    let name = if target.starts_with('/') || target == "*" {
        from_field.ok_or(Refusal::NoName)?
    } else {
        let from_target = absolute_host(target)?;
        if from_field.is_some_and(|h| h != from_target) {
            return Err(Refusal::Malformed(
                "an HTTP request whose Host field and target name different hosts",
            ));
        }
        from_target
    };

    let te: Vec<&[u8]> = named("transfer-encoding").map(|h| h.value).collect();
    let cl: Vec<&[u8]> = named("content-length").map(|h| h.value).collect();
    let mut framing = if let Some(&first) = te.first() {
        if !cl.is_empty() {
            return Err(Refusal::Malformed(
                "an HTTP request with both Transfer-Encoding and Content-Length",
            ));
        }
        if req.version == Some(0) {
            return Err(Refusal::Malformed(
                "Transfer-Encoding in an HTTP/1.0 request",
            ));
        }
        if te.len() != 1 || !first.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            return Err(Refusal::Malformed(
                "an HTTP request with a Transfer-Encoding other than chunked",
            ));
        }
        Framing::Chunked
    } else {
        match content_length(&cl)? {
            None | Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
        }
    };
    if named("upgrade").next().is_some() {
        framing = Framing::Opaque;
    }
    Ok(Head { name, framing })
}

/// The one length all `Content-Length` values (fields and comma-separated lists) agree on.
fn content_length(values: &[&[u8]]) -> Result<Option<u64>, Refusal> {
    let bad = Refusal::Malformed("an HTTP request with a bad Content-Length");
    let mut n = None;
    for v in values {
        for part in v.split(|&b| b == b',') {
            let p = part.trim_ascii();
            if p.is_empty() || p.len() > 18 || !p.iter().all(u8::is_ascii_digit) {
                return Err(bad);
            }
            let x = std::str::from_utf8(p)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(bad.clone())?;
            if n.is_some_and(|m| m != x) {
                return Err(bad);
            }
            n = Some(x);
        }
    }
    Ok(n)
}

/// The host of a Host field value or an authority: `name`, `name:port`, `[v6]:port`.
fn host_name(value: &[u8]) -> Result<String, Refusal> {
    let v = value.trim_ascii();
    if v.is_empty() {
        return Err(Refusal::NoName);
    }
    if v.first() == Some(&b'[') {
        return Err(Refusal::IpLiteral(name::shown(v)));
    }
    let host = match v.iter().rposition(|&b| b == b':') {
        Some(i) => {
            let port = v.get(i + 1..).unwrap_or_default();
            if port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
                return Err(Refusal::BadName(name::shown(v)));
            }
            v.get(..i).unwrap_or_default()
        }
        None => v,
    };
    name::normalize(host)
}

/// The host of an absolute-form request target (`http://name:port/path`).
fn absolute_host(target: &str) -> Result<String, Refusal> {
    let (scheme, rest) = target.split_once("://").ok_or(Refusal::Malformed(
        "an HTTP request target that is no path or http:// URI",
    ))?;
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(Refusal::Malformed(
            "an HTTP request target of another scheme than http",
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(Refusal::Malformed("a user name in an HTTP request target"));
    }
    host_name(authority.as_bytes())
}

/// Where the reading of a connection's requests stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In a request head (or the empty lines before one).
    Head,
    /// In a body, this many bytes left.
    Body(u64),
    /// In a chunk-size line.
    ChunkSize {
        digits: u8,
        size: u64,
        /// Past the size: in extensions (skipped).
        ext: bool,
        /// A CR was read: the next byte must be LF.
        cr: bool,
        len: usize,
    },
    /// In a chunk's data, this many bytes left.
    ChunkData(u64),
    /// After a chunk's data: its CRLF (`cr`: the CR is read).
    ChunkEnd { cr: bool },
    /// In the trailer section: the current line's length, the section's, a CR read.
    Trailers { line: usize, total: usize, cr: bool },
    /// Past an upgrade: nothing is read.
    Opaque,
}

impl State {
    fn after(f: Framing) -> State {
        match f {
            Framing::Empty => State::Head,
            Framing::Length(n) => State::Body(n),
            Framing::Chunked => State::ChunkSize {
                digits: 0,
                size: 0,
                ext: false,
                cr: false,
                len: 0,
            },
            Framing::Opaque => State::Opaque,
        }
    }
}

/// The requests a client sends on one connection after its first head: each later head is
/// held back until it is complete and names the first one's host.
#[derive(Debug)]
pub(super) struct Requests {
    name: String,
    state: State,
    /// The head being read.
    head: Vec<u8>,
    max_head: usize,
}

impl Requests {
    /// The requests after a first head naming `name` and followed by `framing`; heads longer
    /// than `max_head` are refused.
    pub(super) fn after(name: String, framing: Framing, max_head: usize) -> Requests {
        Requests {
            name,
            state: State::after(framing),
            head: Vec::new(),
            max_head,
        }
    }

    /// Reads `input`, the client's next bytes, and appends what may go on to the server to
    /// `out`. Err: the connection is to be cut (nothing of the offending request went out).
    pub(super) fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), Refusal> {
        while let Some((&b, rest)) = input.split_first() {
            match &mut self.state {
                State::Opaque => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Body(n) | State::ChunkData(n) => {
                    let k = usize::try_from(*n).unwrap_or(usize::MAX).min(input.len());
                    let (data, rest) = input.split_at(k);
                    out.extend_from_slice(data);
                    input = rest;
                    *n -= k as u64;
                    if *n == 0 {
                        self.state = match self.state {
                            State::ChunkData(_) => State::ChunkEnd { cr: false },
                            _ => State::Head,
                        };
                    }
                }
                State::Head => {
                    let line_end = input.iter().position(|&c| c == b'\n');
                    let (line, rest) = input.split_at(line_end.map_or(input.len(), |i| i + 1));
                    input = rest;
                    if self.head.len() + line.len() > self.max_head {
                        return Err(Refusal::TooLarge);
                    }
                    self.head.extend_from_slice(line);
                    if line_end.is_none() {
                        continue;
                    }
                    if self.head == b"\r\n" || self.head == b"\n" {
                        // An empty line between requests passes (RFC 9112 §2.2).
                        out.append(&mut self.head);
                        continue;
                    }
                    if self.head.ends_with(b"\n\r\n") || self.head.ends_with(b"\n\n") {
                        let head = parse_head(&self.head)?;
                        if head.name != self.name {
                            return Err(Refusal::HostChanged(head.name));
                        }
                        out.append(&mut self.head);
                        self.state = State::after(head.framing);
                    }
                }
                _ => {
                    input = rest;
                    out.push(b);
                    self.state = self.byte(b)?;
                }
            }
        }
        Ok(())
    }

    /// The state after byte `b` of a chunk line, chunk end or trailer.
    fn byte(&self, b: u8) -> Result<State, Refusal> {
        let bad = |why| Err(Refusal::Malformed(why));
        match self.state {
            State::ChunkSize {
                digits,
                size,
                ext,
                cr,
                len,
            } => {
                if len >= MAX_CHUNK_LINE {
                    return bad("an HTTP chunk-size line too long");
                }
                let len = len + 1;
                if cr {
                    return match b {
                        b'\n' if size == 0 => Ok(State::Trailers {
                            line: 0,
                            total: 0,
                            cr: false,
                        }),
                        b'\n' => Ok(State::ChunkData(size)),
                        _ => bad("a CR without LF in an HTTP chunk-size line"),
                    };
                }
                match (b, ext) {
                    (b'\r', _) if digits > 0 => Ok(State::ChunkSize {
                        digits,
                        size,
                        ext,
                        cr: true,
                        len,
                    }),
                    (b'\n', _) => bad("a bare LF in an HTTP chunk-size line"),
                    (_, true) => Ok(State::ChunkSize {
                        digits,
                        size,
                        ext,
                        cr,
                        len,
                    }),
                    (b';' | b' ' | b'\t', false) if digits > 0 => Ok(State::ChunkSize {
                        digits,
                        size,
                        ext: true,
                        cr,
                        len,
                    }),
                    (d, false) if d.is_ascii_hexdigit() => {
                        if digits >= MAX_CHUNK_DIGITS {
                            return bad("an HTTP chunk size too large");
                        }
                        let v = u64::from(char::from(d).to_digit(16).unwrap_or(0));
                        Ok(State::ChunkSize {
                            digits: digits + 1,
                            size: size << 4 | v,
                            ext,
                            cr,
                            len,
                        })
                    }
                    _ => bad("a bad HTTP chunk-size line"),
                }
            }
            State::ChunkEnd { cr: false } if b == b'\r' => Ok(State::ChunkEnd { cr: true }),
            State::ChunkEnd { cr: true } if b == b'\n' => Ok(State::after(Framing::Chunked)),
            State::ChunkEnd { .. } => bad("an HTTP chunk not ended by CRLF"),
            State::Trailers { line, total, cr } => {
                if total >= self.max_head {
                    return Err(Refusal::TooLarge);
                }
                let total = total + 1;
                match (b, cr) {
                    (b'\n', true) if line == 0 => Ok(State::Head),
                    (b'\n', true) => Ok(State::Trailers {
                        line: 0,
                        total,
                        cr: false,
                    }),
                    (b'\n', false) | (_, true) => bad("a bare CR or LF in HTTP trailers"),
                    (b'\r', false) => Ok(State::Trailers {
                        line,
                        total,
                        cr: true,
                    }),
                    _ => Ok(State::Trailers {
                        line: line + 1,
                        total,
                        cr,
                    }),
                }
            }
            // Not reached: `feed` handles these states itself.
            State::Head | State::Body(_) | State::ChunkData(_) | State::Opaque => Ok(self.state),
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};

    use super::*;

    fn head(s: &str) -> Result<Head, Refusal> {
        let b = s.as_bytes();
        assert_eq!(head_end(b, 0), Some(b.len()), "{s:?} is one whole head");
        parse_head(b)
    }

    fn named(name: &str, framing: Framing) -> Result<Head, Refusal> {
        Ok(Head {
            name: name.into(),
            framing,
        })
    }

    #[test]
    fn the_host_comes_from_the_host_field_or_an_absolute_target() {
        assert_eq!(
            head("GET /simple/ HTTP/1.1\r\nHost: PyPI.org.:80\r\nAccept: */*\r\n\r\n"),
            named("pypi.org", Framing::Empty)
        );
        assert_eq!(
            head("GET http://pypi.org:8080/x?y HTTP/1.1\r\n\r\n"),
            named("pypi.org", Framing::Empty)
        );
        assert_eq!(
            head("GET http://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n"),
            named("pypi.org", Framing::Empty)
        );
        assert_eq!(
            head("OPTIONS * HTTP/1.1\nHost: a.test\n\n"),
            named("a.test", Framing::Empty)
        );
        assert_eq!(
            head("\r\n\r\nGET / HTTP/1.0\r\nHost: a.test\r\n\r\n"),
            named("a.test", Framing::Empty),
            "empty lines before a request are skipped"
        );
    }

    #[test]
    fn requests_without_a_usable_host_are_refused() {
        assert_eq!(head("GET / HTTP/1.0\r\n\r\n"), Err(Refusal::NoName));
        assert_eq!(
            head("GET / HTTP/1.1\r\nHost:\r\n\r\n"),
            Err(Refusal::NoName)
        );
        assert_eq!(
            head("GET / HTTP/1.1\r\nHost: 10.0.0.1:80\r\n\r\n"),
            Err(Refusal::IpLiteral("10.0.0.1".into()))
        );
        assert!(matches!(
            head("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Err(Refusal::IpLiteral(_))
        ));
        assert_eq!(
            head("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"),
            Err(Refusal::Tunnel)
        );
        for bad in [
            "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n",
            "GET https://a.test/ HTTP/1.1\r\n\r\n",
            "GET http://user@a.test/ HTTP/1.1\r\n\r\n",
            "GET a.test/ HTTP/1.1\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\n",
            "GET / HTTP/1.1\r\nHost a.test\r\n\r\n",
        ] {
            assert!(matches!(head(bad), Err(Refusal::Malformed(_))), "{bad:?}");
        }
        for bad in [
            "GET / HTTP/1.1\r\nHost: a.test:http\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a test\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a.test%2fevil\r\n\r\n",
        ] {
            assert!(matches!(head(bad), Err(Refusal::BadName(_))), "{bad:?}");
        }
        let many: String = (0..101).map(|i| format!("X-{i}: y\r\n")).collect();
        let over = format!("GET / HTTP/1.1\r\nHost: a.test\r\n{many}\r\n");
        assert!(matches!(head(&over), Err(Refusal::Malformed(_))));
    }

    #[test]
    fn bodies_are_framed_strictly() {
        let h = |extra: &str| head(&format!("POST / HTTP/1.1\r\nHost: a.test\r\n{extra}\r\n"));
        assert_eq!(
            h("Content-Length: 5\r\n"),
            named("a.test", Framing::Length(5))
        );
        assert_eq!(
            h("Content-Length: 5, 5\r\nContent-Length: 5\r\n"),
            named("a.test", Framing::Length(5))
        );
        assert_eq!(h("Content-Length: 0\r\n"), named("a.test", Framing::Empty));
        assert_eq!(
            h("Transfer-Encoding: Chunked\r\n"),
            named("a.test", Framing::Chunked)
        );
        assert_eq!(
            h("Upgrade: websocket\r\nConnection: Upgrade\r\n"),
            named("a.test", Framing::Opaque)
        );
        for bad in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 5x\r\n",
            "Content-Length: 99999999999999999999\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: identity\r\n",
        ] {
            assert!(matches!(h(bad), Err(Refusal::Malformed(_))), "{bad:?}");
        }
        assert!(matches!(
            head("POST / HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn the_end_of_a_head_is_found_however_it_arrives() {
        let s = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\nGET /2 HTTP/1.1\r\n";
        let end = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n".len();
        assert_eq!(head_end(s, 0), Some(end));
        for cut in 0..end {
            assert_eq!(head_end(&s[..cut], 0), None, "cut at {cut}");
        }
        // Resuming where an earlier call stopped finds the same end.
        for from in 0..=end {
            assert_eq!(head_end(s, from), Some(end), "from {from}");
        }
        assert_eq!(head_end(b"\r\n\r\n", 0), None, "empty lines only");
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n", 0), Some(16));
    }

    /// Feeds `bytes` in reads of `step`; what went out, or the refusal.
    fn feed_all(r: &mut Requests, bytes: &[u8], step: usize) -> Result<Vec<u8>, Refusal> {
        let mut out = Vec::new();
        for chunk in bytes.chunks(step) {
            r.feed(chunk, &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn later_requests_must_name_the_same_host() {
        let same = concat!(
            "POST /a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 32\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: b.test\r\n\r\n",
            "\r\n",
            "POST /c HTTP/1.1\r\nHost: A.test:80\r\nTransfer-Encoding: chunked\r\n\r\n",
            "5;ext=1\r\nhello\r\n10\r\nGET / HTTP/1.1\r\n\r\n0\r\nX-T: 1\r\n\r\n",
            "GET /d HTTP/1.1\r\nHost: a.test\r\n\r\n",
        );
        // The first request's head was read by the caller; its body (which looks like a
        // request for b.test) and the rest follow.
        let first_head = "POST /a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 32\r\n\r\n".len();
        let rest = &same.as_bytes()[first_head..];
        for step in [1, 2, 3, 7, 64, rest.len()] {
            let mut r = Requests::after("a.test".into(), Framing::Length(32), 16384);
            assert_eq!(
                feed_all(&mut r, rest, step).unwrap(),
                rest,
                "reads of {step}"
            );
        }

        let other = "GET / HTTP/1.1\r\nHost: a.test\r\n\r\nGET / HTTP/1.1\r\nHost: b.test\r\n\r\n";
        let mut r = Requests::after("a.test".into(), Framing::Empty, 16384);
        let mut out = Vec::new();
        assert_eq!(
            r.feed(other.as_bytes(), &mut out),
            Err(Refusal::HostChanged("b.test".into()))
        );
        assert_eq!(
            out, b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "nothing of the refused request went out"
        );

        // A chunked body cannot hide a request from the proxy and show it to the server.
        let smuggle = "1\nX\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: b.test\r\n\r\n";
        let mut r = Requests::after("a.test".into(), Framing::Chunked, 16384);
        assert!(matches!(
            feed_all(&mut r, smuggle.as_bytes(), 4096),
            Err(Refusal::Malformed(_))
        ));

        // After an upgrade, bytes pass unread.
        let mut r = Requests::after("a.test".into(), Framing::Opaque, 16384);
        assert_eq!(
            feed_all(&mut r, b"\x81\x05hello", 3).unwrap(),
            b"\x81\x05hello"
        );

        // A head that never ends is refused at the bound.
        let mut r = Requests::after("a.test".into(), Framing::Empty, 64);
        let endless = format!("GET / HTTP/1.1\r\n{}", "X: y\r\n".repeat(20));
        assert_eq!(
            feed_all(&mut r, endless.as_bytes(), 5),
            Err(Refusal::TooLarge)
        );
    }

    #[test]
    fn garbage_never_panics() {
        let good = concat!(
            "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n",
            "5\r\nhello\r\n0\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\nabc",
        )
        .as_bytes();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..20_000 {
            let mut b = good.to_vec();
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
            if let Some(end) = head_end(&b, 0) {
                let _ = parse_head(&b[..end]);
            }
            let mut r = Requests::after("a.test".into(), Framing::Empty, 256);
            let _ = feed_all(&mut r, &b, rng.random_range(1..32));
        }
    }
}
