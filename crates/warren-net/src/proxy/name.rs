//! The name a connection asks for (a TLS server name, an HTTP host), as the policy sees it:
//! lower case, no trailing dot, letters, digits, `-` and `_` in labels of 1 to 63, 253 in
//! all. Anything else is refused, IP literals apart so the incident says what was tried.

use std::net::IpAddr;

use super::Refusal;

/// The longest name kept in a [`Refusal`] (a refused name may be kilobytes of garbage).
const SHOWN: usize = 256;

/// `raw` as the policy sees it, or why it is refused.
pub(super) fn normalize(raw: &[u8]) -> Result<String, Refusal> {
    let trimmed = raw.strip_suffix(b".").unwrap_or(raw);
    if let Ok(s) = std::str::from_utf8(trimmed)
        && s.parse::<IpAddr>().is_ok()
    {
        return Err(Refusal::IpLiteral(s.to_string()));
    }
    let valid = (1..=253).contains(&trimmed.len())
        && trimmed.split(|&b| b == b'.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err(Refusal::BadName(shown(raw)));
    }
    Ok(trimmed
        .iter()
        .map(|&b| char::from(b.to_ascii_lowercase()))
        .collect())
}

/// `raw` escaped for a log line (`\xNN` for anything but printable ASCII), at most
/// [`SHOWN`] bytes of it.
pub(super) fn shown(raw: &[u8]) -> String {
    let cut = raw.get(..SHOWN).unwrap_or(raw);
    let mut s = cut.escape_ascii().to_string();
    if cut.len() < raw.len() {
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowered_and_trimmed_and_odd_ones_refused() {
        assert_eq!(normalize(b"PyPI.org.").unwrap(), "pypi.org");
        assert_eq!(normalize(b"_a.b-c.D9").unwrap(), "_a.b-c.d9");
        assert_eq!(
            normalize(b"10.0.0.1"),
            Err(Refusal::IpLiteral("10.0.0.1".into()))
        );
        assert_eq!(normalize(b"::1"), Err(Refusal::IpLiteral("::1".into())));
        for bad in [
            &b""[..],
            b".",
            b"a..b",
            b"a b.com",
            b"a\0.com",
            b"caf\xc3\xa9.com",
            b"pypi.org/evil",
            b"a.b:443",
        ] {
            assert!(
                matches!(normalize(bad), Err(Refusal::BadName(_))),
                "{bad:?}"
            );
        }
        let long = [b'a'; 64];
        assert!(normalize(&long).is_err(), "a label of 64");
        let many = "a.".repeat(128);
        assert!(
            normalize(many.as_bytes()).is_err(),
            "255 bytes without the final dot"
        );
        let shown_long = shown(&[b'x'; 1000]);
        assert_eq!(shown_long.len(), SHOWN + 3);
        assert_eq!(shown(b"a\0b"), "a\\x00b");
    }
}
