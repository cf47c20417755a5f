//! E2B-form keys (`e2b_` + 40 lower-case hex: the form SDKs 2.25 to 2.45 insist on), the
//! check of a presented one, and the per-sandbox envd access tokens, derived from the key so
//! the gateway keeps no table of them.

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

/// The envd access token of sandbox `id`: what a secure sandbox's in-sandbox calls must carry
/// (`X-Access-Token`).
pub fn access_token(key: &str, id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"warren-e2b envd access token\0");
    h.update(key.as_bytes());
    h.update(b"\0");
    h.update(id.as_bytes());
    hex(&h.finalize()[..20])
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
    fn access_tokens_differ_by_sandbox_and_key() {
        let (k1, k2) = (new_key(), new_key());
        let t = access_token(&k1, "abc");
        assert_eq!(t, access_token(&k1, "abc"));
        assert_ne!(t, access_token(&k1, "abd"));
        assert_ne!(t, access_token(&k2, "abc"));
        assert_eq!(t.len(), 40);
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
