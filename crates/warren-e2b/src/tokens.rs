//! The gateway's envd access tokens at run time: answering them (bound to the caller's key and
//! an expiry, see `keys::TokenKey`), checking them, and the few each sandbox has shown lately.
//!
//! A signed file URL (`download_url`/`upload_url`) carries a hash of the token, not the token:
//! to check one the gateway needs the tokens of the sandbox the request names. It remembers the
//! last [`PER_SANDBOX`] tokens it answered or accepted for each sandbox (at most
//! [`MAX_SANDBOXES`] sandboxes), in memory only: after a restart a signed URL works again once
//! its token has been used (any SDK call) or answered again (connect).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::keys::{Grant, TokenError, TokenKey};

/// Tokens remembered per sandbox, newest last.
const PER_SANDBOX: usize = 8;
/// Sandboxes whose tokens are remembered; past it the expired go, then all.
const MAX_SANDBOXES: usize = 50_000;

/// The gateway's envd access tokens.
#[derive(Debug)]
pub struct Tokens {
    key: TokenKey,
    /// The Warren key id of the gateway's own identity (the admin key), asked once.
    own_key_id: tokio::sync::OnceCell<String>,
    /// Sandbox id → its recent tokens and their expiry.
    seen: Mutex<HashMap<String, VecDeque<(String, i64)>>>,
}

/// Seconds since the epoch.
pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Tokens {
    /// Tokens signed with `key`.
    pub fn new(key: TokenKey) -> Tokens {
        Tokens {
            key,
            own_key_id: tokio::sync::OnceCell::new(),
            seen: Mutex::default(),
        }
    }

    /// The id of the Warren key `warren` acts with (the gateway's own), asked of Warren once.
    pub(crate) async fn own_key_id(
        &self,
        warren: &warren_sdk::Client,
    ) -> Result<String, warren_sdk::Error> {
        self.own_key_id
            .get_or_try_init(|| async { warren.whoami().await.map(|w| w.key_id) })
            .await
            .cloned()
    }

    /// A token of `sandbox` for `key_id`, valid until `end` (the sandbox's end, seconds since
    /// the epoch; now if it is past) plus [`crate::keys::TOKEN_GRACE_SECS`].
    pub(crate) fn issue(&self, key_id: &str, sandbox: &str, end: Option<i64>) -> String {
        let now = now();
        let expires = end.unwrap_or(now).max(now) + crate::keys::TOKEN_GRACE_SECS;
        let token = self.key.issue(key_id, sandbox, expires);
        self.remember(sandbox, &token, expires);
        token
    }

    /// What `token` grants on `sandbox` now, or why nothing.
    pub(crate) fn check(&self, token: &str, sandbox: &str) -> Result<Grant, TokenError> {
        let grant = self.key.check(token, sandbox, now())?;
        self.remember(sandbox, token, grant.expires);
        Ok(grant)
    }

    /// The remembered token of `sandbox` for which `signs` holds (at most [`PER_SANDBOX`]
    /// tried).
    pub(crate) fn find(&self, sandbox: &str, signs: impl Fn(&str) -> bool) -> Option<String> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(sandbox)?
            .iter()
            .rev()
            .find(|(t, _)| signs(t))
            .map(|(t, _)| t.clone())
    }

    fn remember(&self, sandbox: &str, token: &str, expires: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.contains_key(sandbox) && seen.len() >= MAX_SANDBOXES {
            let now = now();
            seen.retain(|_, ts| {
                ts.retain(|(_, e)| *e > now);
                !ts.is_empty()
            });
            if seen.len() >= MAX_SANDBOXES {
                seen.clear();
            }
        }
        let ts = seen.entry(sandbox.to_string()).or_default();
        if let Some(i) = ts.iter().position(|(t, _)| t == token) {
            ts.remove(i);
        }
        ts.push_back((token.to_string(), expires));
        while ts.len() > PER_SANDBOX {
            ts.pop_front();
        }
    }
}

/// Seconds since the epoch of an RFC 3339 time as Warren writes them (`2026-01-02T03:04:05Z`,
/// with or without a fraction), if it is one.
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    humantime::parse_rfc3339(s)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_last_past_the_sandboxs_end_and_are_remembered_per_sandbox() {
        let t = Tokens::new(TokenKey::new(b"s", "e2b_k"));
        let end = now() + 600;
        let tok = t.issue("key_a", "sba", Some(end));
        let g = t.check(&tok, "sba").unwrap();
        assert_eq!(g.expires, end + crate::keys::TOKEN_GRACE_SECS);
        assert_eq!(g.key_id, "key_a");
        // A sandbox already past its end still gets the grace from now.
        let g = t.check(&t.issue("key_a", "sbb", Some(0)), "sbb").unwrap();
        assert!(g.expires >= now() + crate::keys::TOKEN_GRACE_SECS - 5);
        assert_eq!(t.find("sba", |x| x == tok), Some(tok.clone()));
        assert_eq!(t.find("sbb", |x| x == tok), None);
        assert_eq!(t.find("sbc", |_| true), None);
        for i in 0..20 {
            t.issue(&format!("key_{i}"), "sba", Some(end));
        }
        assert_eq!(
            t.find("sba", |x| x == tok),
            None,
            "only the last few are kept"
        );
    }

    #[test]
    fn warrens_times_parse() {
        assert_eq!(parse_time("1970-01-01T00:01:40Z"), Some(100));
        assert_eq!(parse_time("1970-01-01T00:01:40.250Z"), Some(100));
        assert_eq!(parse_time("soon"), None);
    }
}
