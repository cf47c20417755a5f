//! A TLS ClientHello read from a connection's first bytes: its server name (SNI) and whether
//! it carries an Encrypted Client Hello extension. No I/O: fed the bytes as they arrive, it
//! says whether it needs more, and looks at each byte once.
//!
//! What it takes (RFC 8446 §4.1.2, RFC 5246 §7.4.1.2, RFC 6066 §3): handshake records
//! (type 22, version 3.x, 1 to 16384 bytes each) whose concatenated fragments start with one
//! ClientHello (a ClientHello may span several records); every length inside it consistent;
//! no extension twice; a `server_name` extension holding exactly one `host_name`. Anything
//! else — another record type first, a zero-length or oversized record, lengths that overrun,
//! bytes after the extensions, no SNI — is refused, never guessed at.

use std::collections::HashSet;

use super::Refusal;
use super::name;

/// TLS record type of handshake messages.
const HANDSHAKE: u8 = 22;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// The largest plaintext record fragment (RFC 8446 §5.1).
const MAX_FRAGMENT: usize = 16384;
/// Extension `server_name` (RFC 6066).
const EXT_SERVER_NAME: u16 = 0;
/// Extension `encrypted_client_hello` (RFC 9849).
const EXT_ECH: u16 = 0xfe0d;
/// Name type `host_name` in a `server_name` list.
const HOST_NAME: u8 = 0;

/// What a ClientHello says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hello {
    /// The server name, normalised ([`name::normalize`]).
    pub name: String,
    /// It carries an `encrypted_client_hello` extension: the name above is then only the
    /// client-facing server's public name (or the hello is GREASE, which looks the same).
    pub ech: bool,
}

/// Where reading stands.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// More bytes are needed.
    More,
    /// The whole ClientHello has arrived.
    Done(Hello),
    /// It is no ClientHello the proxy can judge.
    Refuse(Refusal),
}

/// Reads one ClientHello from the bytes of a connection, however they are cut into reads.
#[derive(Debug)]
pub(super) struct HelloReader {
    /// The most bytes read before giving up ([`Refusal::TooLarge`]).
    max: usize,
    /// The handshake bytes of the complete records seen so far.
    handshake: Vec<u8>,
    /// Where the next record starts in the connection's bytes.
    next: usize,
}

impl HelloReader {
    /// A reader that gives up after `max` bytes.
    pub(super) fn new(max: usize) -> HelloReader {
        HelloReader {
            max,
            handshake: Vec::new(),
            next: 0,
        }
    }

    /// Reads on. `read` is every byte the connection has sent so far: what an earlier call
    /// saw, and more.
    pub(super) fn advance(&mut self, read: &[u8]) -> Progress {
        loop {
            let Some(header) = read.get(self.next..self.next.saturating_add(5)) else {
                return self.more(read);
            };
            let &[kind, major, _, hi, lo] = header else {
                return self.more(read);
            };
            if kind != HANDSHAKE {
                return Progress::Refuse(Refusal::Malformed("not a TLS handshake record"));
            }
            if major != 3 {
                return Progress::Refuse(Refusal::Malformed("not a TLS record version"));
            }
            let len = usize::from(u16::from_be_bytes([hi, lo]));
            if len == 0 || len > MAX_FRAGMENT {
                return Progress::Refuse(Refusal::Malformed("a TLS record of a bad length"));
            }
            let start = self.next + 5;
            let Some(fragment) = read.get(start..start + len) else {
                return self.more(read);
            };
            self.handshake.extend_from_slice(fragment);
            self.next = start + len;
            if let Some(&[kind, a, b, c]) = self.handshake.get(..4) {
                if kind != CLIENT_HELLO {
                    return Progress::Refuse(Refusal::Malformed("not a ClientHello"));
                }
                let body = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                if body.saturating_add(4) > self.max {
                    return Progress::Refuse(Refusal::TooLarge);
                }
                if let Some(hello) = self.handshake.get(4..4 + body) {
                    return match parse(hello) {
                        Ok(h) => Progress::Done(h),
                        Err(r) => Progress::Refuse(r),
                    };
                }
            }
        }
    }

    fn more(&self, read: &[u8]) -> Progress {
        if read.len() >= self.max {
            Progress::Refuse(Refusal::TooLarge)
        } else {
            Progress::More
        }
    }
}

/// Reads big-endian fields and length-prefixed vectors off a slice; None past its end.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }

    fn u16(&mut self) -> Option<u16> {
        let &[a, b] = self.take(2)? else { return None };
        Some(u16::from_be_bytes([a, b]))
    }

    /// A vector with a one-byte length.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

const CUT: Refusal = Refusal::Malformed("a ClientHello whose lengths do not add up");

/// The body of a ClientHello (after its 4-byte handshake header).
fn parse(body: &[u8]) -> Result<Hello, Refusal> {
    let mut c = Cursor(body);
    let version = c.u16().ok_or(CUT)?;
    if version >> 8 != 3 {
        return Err(Refusal::Malformed("not a TLS ClientHello version"));
    }
    c.take(32).ok_or(CUT)?; // random
    let session = c.vec8().ok_or(CUT)?;
    let suites = c.vec16().ok_or(CUT)?;
    let compression = c.vec8().ok_or(CUT)?;
    if session.len() > 32 || suites.is_empty() || suites.len() % 2 != 0 || compression.is_empty() {
        return Err(CUT);
    }
    if c.is_empty() {
        // No extensions at all (TLS 1.2 and older allow it): no server name.
        return Err(Refusal::NoName);
    }
    let extensions = c.vec16().ok_or(CUT)?;
    if !c.is_empty() {
        return Err(CUT);
    }
    let mut e = Cursor(extensions);
    let mut seen = HashSet::new();
    let mut name = None;
    let mut ech = false;
    while !e.is_empty() {
        let kind = e.u16().ok_or(CUT)?;
        let data = e.vec16().ok_or(CUT)?;
        if !seen.insert(kind) {
            return Err(Refusal::Malformed("a ClientHello with an extension twice"));
        }
        match kind {
            EXT_SERVER_NAME => name = Some(server_name(data)?),
            EXT_ECH => ech = true,
            _ => {}
        }
    }
    Ok(Hello {
        name: name.ok_or(Refusal::NoName)?,
        ech,
    })
}

/// The `host_name` of a `server_name` extension.
fn server_name(data: &[u8]) -> Result<String, Refusal> {
    let mut c = Cursor(data);
    let list = c.vec16().ok_or(CUT)?;
    if !c.is_empty() || list.is_empty() {
        return Err(CUT);
    }
    let mut l = Cursor(list);
    let mut host = None;
    while !l.is_empty() {
        let kind = l.u8().ok_or(CUT)?;
        let name = l.vec16().ok_or(CUT)?;
        if kind == HOST_NAME {
            if host.is_some() {
                return Err(Refusal::Malformed("a ClientHello with two server names"));
            }
            host = Some(name);
        }
    }
    name::normalize(host.ok_or(Refusal::NoName)?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::{RngExt, SeedableRng};
    use rustls::pki_types::ServerName;

    use super::*;

    /// The first flight of a real rustls client (TLS 1.3 and 1.2 offered) for `server`.
    fn rustls_hello(server: ServerName<'static>, sni: bool) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        config.enable_sni = sni;
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    fn name(s: &str) -> ServerName<'static> {
        ServerName::try_from(s.to_string()).unwrap()
    }

    /// The handshake message of a single-record hello, cut into records of `sizes` (the last
    /// one takes the rest).
    fn resplit(one_record: &[u8], sizes: &[usize]) -> Vec<u8> {
        let msg = &one_record[5..];
        let mut out = Vec::new();
        let mut rest = msg;
        for (i, &n) in sizes.iter().enumerate() {
            let n = if i + 1 == sizes.len() {
                rest.len()
            } else {
                n.min(rest.len())
            };
            let (frag, r) = rest.split_at(n);
            out.extend_from_slice(&[HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(frag.len() as u16).to_be_bytes());
            out.extend_from_slice(frag);
            rest = r;
        }
        out
    }

    /// Feeds `bytes` in reads of `step` bytes; the first answer that is not `More`.
    fn read_in_steps(bytes: &[u8], step: usize, max: usize) -> Progress {
        let mut r = HelloReader::new(max);
        let mut end = 0;
        loop {
            end = (end + step).min(bytes.len());
            match r.advance(&bytes[..end]) {
                Progress::More if end == bytes.len() => return Progress::More,
                Progress::More => {}
                other => return other,
            }
        }
    }

    /// A hand-made ClientHello with these extensions (type, data), in one record.
    fn handmade(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // no session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        let mut ext = Vec::new();
        for (kind, data) in extensions {
            ext.extend_from_slice(&kind.to_be_bytes());
            ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
            ext.extend_from_slice(data);
        }
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut msg = vec![CLIENT_HELLO, 0];
        msg.extend_from_slice(&(body.len() as u16).to_be_bytes());
        msg.extend_from_slice(&body);
        let mut rec = vec![HANDSHAKE, 3, 1];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    /// A `server_name` extension's data with these (type, name) entries.
    fn sni(entries: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = Vec::new();
        for (kind, n) in entries {
            list.push(*kind);
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n);
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        data
    }

    fn done(name: &str) -> Progress {
        Progress::Done(Hello {
            name: name.into(),
            ech: false,
        })
    }

    #[test]
    fn a_real_client_hello_gives_its_server_name_in_any_cut() {
        let hello = rustls_hello(name("Files.PythonHosted.org"), true);
        assert!(hello.len() > 200, "{}", hello.len());
        for step in [1, 2, 5, 7, 100, hello.len()] {
            assert_eq!(
                read_in_steps(&hello, step, 16384),
                done("files.pythonhosted.org"),
                "reads of {step}"
            );
        }
        // Bytes after the hello (early data, a pipelined record) change nothing.
        let mut more = hello.clone();
        more.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(
            read_in_steps(&more, 4096, 16384),
            done("files.pythonhosted.org")
        );
    }

    #[test]
    fn a_hello_split_across_records_is_put_together() {
        let hello = rustls_hello(name("pypi.org"), true);
        for sizes in [&[1usize, 1, 1, 1][..], &[3, 50], &[60, 60, 60], &[4]] {
            let split = resplit(&hello, sizes);
            for step in [1, 3, split.len()] {
                assert_eq!(
                    read_in_steps(&split, step, 16384),
                    done("pypi.org"),
                    "{sizes:?} in reads of {step}"
                );
            }
        }
        // Every fragment one byte: about 6 bytes a byte, still read in one pass.
        let ones = resplit(&hello, &vec![1; hello.len()]);
        assert_eq!(read_in_steps(&ones, 1, 1 << 20), done("pypi.org"));
    }

    #[test]
    fn truncated_hellos_ask_for_more_and_never_answer_early() {
        let hello = rustls_hello(name("pypi.org"), true);
        for cut in 0..hello.len() {
            let mut r = HelloReader::new(16384);
            assert_eq!(r.advance(&hello[..cut]), Progress::More, "cut at {cut}");
        }
    }

    #[test]
    fn no_server_name_or_an_address_is_refused() {
        let none = rustls_hello(name("pypi.org"), false);
        assert_eq!(
            read_in_steps(&none, 4096, 16384),
            Progress::Refuse(Refusal::NoName)
        );
        // rustls sends no SNI for an address; a hand-made hello does.
        let ip = rustls_hello(
            ServerName::IpAddress("10.0.0.1".parse::<std::net::IpAddr>().unwrap().into()),
            true,
        );
        assert_eq!(
            read_in_steps(&ip, 4096, 16384),
            Progress::Refuse(Refusal::NoName)
        );
        let literal = handmade(&[(0, sni(&[(0, b"10.0.0.1")]))]);
        assert_eq!(
            read_in_steps(&literal, 4096, 16384),
            Progress::Refuse(Refusal::IpLiteral("10.0.0.1".into()))
        );
        let no_ext = {
            // The same hello with its extensions block removed (allowed before TLS 1.3).
            let mut h = handmade(&[]);
            h.truncate(h.len() - 2);
            let body_len = h.len() - 9;
            h[6..9].copy_from_slice(&(body_len as u32).to_be_bytes()[1..]);
            let rec_len = h.len() - 5;
            h[3..5].copy_from_slice(&(rec_len as u16).to_be_bytes());
            h
        };
        assert_eq!(
            read_in_steps(&no_ext, 4096, 16384),
            Progress::Refuse(Refusal::NoName)
        );
        let other_type_only = handmade(&[(0, sni(&[(1, b"pypi.org")]))]);
        assert_eq!(
            read_in_steps(&other_type_only, 4096, 16384),
            Progress::Refuse(Refusal::NoName)
        );
    }

    #[test]
    fn ambiguous_hellos_are_refused() {
        let two_names = handmade(&[(0, sni(&[(0, b"pypi.org"), (0, b"evil.com")]))]);
        assert!(matches!(
            read_in_steps(&two_names, 4096, 16384),
            Progress::Refuse(Refusal::Malformed(_))
        ));
        let twice = handmade(&[(0, sni(&[(0, b"pypi.org")])), (0, sni(&[(0, b"evil.com")]))]);
        assert!(matches!(
            read_in_steps(&twice, 4096, 16384),
            Progress::Refuse(Refusal::Malformed(_))
        ));
        let dotted_label = handmade(&[(0, sni(&[(0, b"pypi.org\0.evil.com")]))]);
        assert!(matches!(
            read_in_steps(&dotted_label, 4096, 16384),
            Progress::Refuse(Refusal::BadName(_))
        ));
        let ech = handmade(&[(0, sni(&[(0, b"public.example")])), (EXT_ECH, vec![0; 8])]);
        assert_eq!(
            read_in_steps(&ech, 4096, 16384),
            Progress::Done(Hello {
                name: "public.example".into(),
                ech: true
            })
        );
    }

    #[test]
    fn oversized_hellos_are_refused_at_the_bound() {
        let hello = rustls_hello(name("pypi.org"), true);
        // A bound below the hello's length: refused once that many bytes are in.
        assert_eq!(
            read_in_steps(&hello, 1, 64),
            Progress::Refuse(Refusal::TooLarge)
        );
        // A large extension: longer than 16 KiB over two records.
        let big = handmade(&[(0, sni(&[(0, b"pypi.org")])), (0x7777, vec![0; 20000])]);
        let big = resplit(&big, &[16000, 0]);
        assert_eq!(
            read_in_steps(&big, 4096, 16384),
            Progress::Refuse(Refusal::TooLarge)
        );
        // Many one-byte records that never finish: refused once `max` bytes are read.
        // (A ClientHello header saying 16000 bytes, then zeros, one byte a record.)
        let endless: Vec<u8> = [1, 0, 0x3e, 0x80]
            .into_iter()
            .chain(std::iter::repeat_n(0, 10_000))
            .flat_map(|b| [HANDSHAKE, 3, 1, 0, 1, b])
            .collect();
        let mut r = HelloReader::new(16384);
        assert_eq!(
            r.advance(&endless[..16384]),
            Progress::Refuse(Refusal::TooLarge)
        );
    }

    #[test]
    fn garbage_is_refused_and_never_panics() {
        for bad in [
            &b"GET / HTTP/1.1\r\n"[..],
            &[HANDSHAKE, 2, 0, 0, 5, 1, 0, 0, 1, 0],
            &[HANDSHAKE, 3, 1, 0, 0],
            &[HANDSHAKE, 3, 1, 0x40, 1],
            &[21, 3, 1, 0, 2, 2, 40],
            &[HANDSHAKE, 3, 1, 0, 4, 2, 0, 0, 0],
        ] {
            assert!(
                matches!(read_in_steps(bad, 4096, 16384), Progress::Refuse(_)),
                "{bad:?}"
            );
        }
        // Real hellos with random bytes changed, and random bytes after a real header: any
        // answer, no panic.
        let hello = rustls_hello(name("pypi.org"), true);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let mut h = hello.clone();
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..h.len());
                h[i] = rng.random();
            }
            let cut = rng.random_range(0..=h.len());
            let _ = read_in_steps(&h[..cut], rng.random_range(1..64), 16384);
        }
        for _ in 0..2_000 {
            let mut h = hello[..9].to_vec();
            let n = rng.random_range(0..600);
            h.extend((0..n).map(|_| rng.random::<u8>()));
            let _ = read_in_steps(&h, 4096, 16384);
        }
    }
}
