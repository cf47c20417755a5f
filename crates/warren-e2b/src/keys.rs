//! E2B-form keys (`e2b_` + 40 lower-case hex: the form SDKs 2.25 to 2.45 insist on), the
//! check of a presented one, and envd access tokens: each names the Warren key it was answered
//! to and when it expires, signed (HMAC) for one sandbox with a secret only the gateway holds,
//! so the gateway keeps no table of them and each envd call acts on behalf of that key.

use sha2::{Digest, Sha256};

/// A new key.
pub fn new_key() -> String {
    let bytes: [u8; 20] = rand::random();
    format!("e2b_{}", hex(&bytes))
}

/// Whether `s` has the key form.
pub fn is_key_form(s: &str) -> bool {
    s.strip_prefix("e2b_").is_some_and(|h| {
        h.len() == 40
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Compares a presented key with the gateway's in time independent of where they differ.
pub fn matches(presented: &str, key: &str) -> bool {
    let (a, b) = (
        Sha256::digest(presented.as_bytes()),
        Sha256::digest(key.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// How long an envd access token outlives the end its sandbox had when it was answered: a
/// sandbox whose timeout is pushed later (E2B's `set_timeout` answers no token) keeps working
/// for this long past its first end; connect answers a fresh token.
pub const TOKEN_GRACE_SECS: i64 = 24 * 3600;

/// The prefix of this gateway's envd access tokens (its format's version).
const TOKEN_PREFIX: &str = "wt1";

/// What signs envd access tokens: HMAC-SHA256 keyed by the gateway's secret and its E2B key
/// together, so neither alone makes one and changing either ends every token.
pub struct TokenKey([u8; 32]);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// What a valid envd access token grants: calls on its sandbox on behalf of this key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The Warren key the token was answered to; its calls are made on its behalf.
    pub key_id: String,
    /// When the token expires, seconds since the epoch.
    pub expires: i64,
}

/// Why an envd access token is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// Not one of this gateway's tokens at all.
    Malformed,
    /// Its signature does not hold for this sandbox: another sandbox's, forged, or made
    /// before the gateway's secret or key changed.
    NotThisSandbox,
    /// Past its expiry (seconds since the epoch).
    Expired(i64),
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenError::Malformed => f.write_str(
                "missing or wrong X-Access-Token: use the envdAccessToken that create or \
                 connect answered for this sandbox",
            ),
            TokenError::NotThisSandbox => f.write_str(
                "X-Access-Token is not this sandbox's (another sandbox's, or not made by this \
                 gateway): use the envdAccessToken that create or connect answered for it",
            ),
            TokenError::Expired(at) => write!(
                f,
                "X-Access-Token expired at {at} (unix seconds): connect to the sandbox again \
                 (Sandbox.connect) for a fresh one"
            ),
        }
    }
}

impl TokenKey {
    /// The token key of the gateway with this secret and E2B key.
    pub fn new(secret: &[u8], gateway_key: &str) -> TokenKey {
        TokenKey(hmac_sha256(secret, gateway_key.as_bytes()))
    }

    fn mac(&self, key_id: &str, sandbox: &str, expires: i64) -> [u8; 32] {
        let msg = format!("warren-e2b envd access token\0{key_id}\0{sandbox}\0{expires}");
        hmac_sha256(&self.0, msg.as_bytes())
    }

    /// The envd access token of `sandbox` for key `key_id`, valid until `expires` (seconds
    /// since the epoch): `wt1.<key id>.<expires>.<HMAC hex>`.
    pub fn issue(&self, key_id: &str, sandbox: &str, expires: i64) -> String {
        format!(
            "{TOKEN_PREFIX}.{key_id}.{expires}.{}",
            hex(&self.mac(key_id, sandbox, expires))
        )
    }

    /// What `token` grants on `sandbox` at `now` (seconds since the epoch), or why nothing.
    pub fn check(&self, token: &str, sandbox: &str, now: i64) -> Result<Grant, TokenError> {
        let mut parts = token.split('.');
        let (Some(TOKEN_PREFIX), Some(key_id), Some(expires), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        let Ok(expires) = expires.parse::<i64>() else {
            return Err(TokenError::Malformed);
        };
        if key_id.is_empty() || key_id.len() > 128 {
            return Err(TokenError::Malformed);
        }
        if !matches(mac, &hex(&self.mac(key_id, sandbox, expires))) {
            return Err(TokenError::NotThisSandbox);
        }
        if expires <= now {
            return Err(TokenError::Expired(expires));
        }
        Ok(Grant {
            key_id: key_id.to_string(),
            expires,
        })
    }
}

/// The gateway's token secret in `path` (32 random bytes as hex, mode 0600), made there at the
/// first start: tokens answered before a restart keep working after it.
pub fn token_secret(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let s = s.trim();
            let ok = s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
            if !ok {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{} does not hold 64 hex digits: remove it to have a new secret made \
                         (E2B access tokens answered before then stop working)",
                        path.display()
                    ),
                ));
            }
            Ok(s.as_bytes().to_vec())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let bytes: [u8; 32] = rand::random();
            let text = hex(&bytes);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            std::io::Write::write_all(&mut f, format!("{text}\n").as_bytes())?;
            Ok(text.into_bytes())
        }
        Err(e) => Err(e),
    }
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.map(|x| x ^ b);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_form_older_sdks_check() {
        let k = new_key();
        assert_eq!(k.len(), 44);
        assert!(is_key_form(&k), "{k}");
        assert_ne!(k, new_key());
        for bad in [
            "e2b_",
            "e2b_XYZ",
            "sk_e2b_00",
            "",
            "e2b_0g",
            "e2b_0",
            &format!("{k}0"),
        ] {
            assert!(!is_key_form(bad), "{bad}");
        }
        assert!(matches(&k, &k));
        assert!(!matches(&k, &new_key()));
        assert!(!matches("", &k));
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test cases 1 and 6 (a key longer than a block).
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn access_tokens_are_bound_to_key_sandbox_and_expiry() {
        let k = TokenKey::new(b"secret", &new_key());
        let t = k.issue("key_abc", "sba", 1000);
        assert!(t.starts_with("wt1.key_abc.1000."), "{t}");
        let grant = Grant {
            key_id: "key_abc".into(),
            expires: 1000,
        };
        assert_eq!(k.check(&t, "sba", 999), Ok(grant));
        // Another sandbox's; expired; its key or expiry changed; another gateway's.
        assert_eq!(k.check(&t, "sbb", 999), Err(TokenError::NotThisSandbox));
        assert_eq!(k.check(&t, "sba", 1000), Err(TokenError::Expired(1000)));
        let forged = t.replace("key_abc", "key_abd");
        assert_eq!(
            k.check(&forged, "sba", 999),
            Err(TokenError::NotThisSandbox)
        );
        let later = t.replace(".1000.", ".9999.");
        assert_eq!(k.check(&later, "sba", 999), Err(TokenError::NotThisSandbox));
        let other = TokenKey::new(b"secret", &new_key());
        assert_eq!(other.check(&t, "sba", 999), Err(TokenError::NotThisSandbox));
        let other = TokenKey::new(b"secret2", "e2b_x");
        assert_eq!(other.check(&t, "sba", 999), Err(TokenError::NotThisSandbox));
        for bad in [
            "",
            "wt1",
            "wt1.key.1.ab.cd",
            "wt2.key_abc.1000.00",
            "wt1..1000.00",
        ] {
            assert_eq!(k.check(bad, "sba", 0), Err(TokenError::Malformed), "{bad}");
        }
        assert_eq!(
            k.check("wt1.key_abc.soon.00", "sba", 0),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn the_token_secret_is_made_once_and_kept() {
        let dir = std::env::temp_dir().join(format!("warren-e2b-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("e2b-token.secret");
        let a = token_secret(&path).unwrap();
        assert_eq!(a.len(), 64);
        assert_eq!(token_secret(&path).unwrap(), a);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, "short").unwrap();
        let e = token_secret(&path).unwrap_err().to_string();
        assert!(e.contains("64 hex digits"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A file URL's v1 signature, as the SDK computes it: `v1_` and the unpadded base64 of
/// `sha256("<path>:<read|write>:<user>:<token>[:<expiration>]")`.
pub fn file_signature(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    use base64::Engine;
    use sha2::Digest;
    let raw = match expiration {
        Some(e) => format!("{path}:{operation}:{user}:{token}:{e}"),
        None => format!("{path}:{operation}:{user}:{token}"),
    };
    let digest = sha2::Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

#[cfg(test)]
mod signature_tests {
    #[test]
    fn signatures_match_the_sdks() {
        // hashlib.sha256(b"/home/user/a.txt:read::tok").digest(), base64, "=" stripped.
        assert_eq!(
            super::file_signature("/home/user/a.txt", "read", "", "tok", None),
            "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY"
        );
        assert_ne!(
            super::file_signature("/home/user/a.txt", "read", "", "tok", Some(5)),
            super::file_signature("/home/user/a.txt", "write", "", "tok", Some(5)),
        );
    }
}
