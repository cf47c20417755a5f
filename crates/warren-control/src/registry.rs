//! Pulls from OCI registries, guarded against server-side request forgery: every host the
//! control plane talks to for a pull — the registry, the token service its
//! `WWW-Authenticate` realm names, every redirect's target — is resolved here, refused when an
//! address is always denied (`warren_types::denied`, less `[control] registry_exempt`), and
//! connected to at exactly the addresses checked (the client's resolver is this check: no
//! second lookup a rebinding name could answer differently). Redirects are followed here, one
//! at a time, never by the HTTP client; credentials go to the registry's own host and its
//! realm only. A remote body is never put in an error: a failure names the status and what to
//! check.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use oci_client::Reference;
use oci_client::manifest::{OciImageIndex, OciImageManifest};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue, LOCATION, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use sha2::Digest as _;
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use warren_types::denied::Denied;

/// Redirects followed for one request at most.
const MAX_REDIRECTS: usize = 5;
/// Largest manifest, index, token answer or config read.
const MAX_DOCUMENT: usize = 16 << 20;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json, \
    application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json";

/// Why a pull failed.
#[derive(Debug)]
pub enum PullError {
    /// A host resolved to an address the control plane does not pull from (403).
    Internal(String),
    /// The registry failed, refused or answered nonsense (503).
    Remote(String),
    /// The writer refused more bytes (the caller's size cap).
    Write(std::io::Error),
}

impl std::fmt::Display for PullError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PullError::Internal(m) | PullError::Remote(m) => f.write_str(m),
            PullError::Write(e) => write!(f, "writing a layer: {e}"),
        }
    }
}

/// The message for `host` resolving to `ip` inside `range`.
fn internal(host: &str, ip: IpAddr, range: warren_types::net::Cidr) -> String {
    let why = warren_types::denied::reviewed(ip)
        .map(|r| format!(" ({})", r.why))
        .unwrap_or_default();
    format!(
        "{host} is {ip}, inside {range}{why}: the control plane does not pull from private, \
         loopback, link-local or metadata addresses; an administrator can allow a registry's \
         range with [control] registry_exempt"
    )
}

/// The client's resolver: looks a name up once, refuses it when any address is denied, and
/// hands the HTTP client exactly the addresses it checked.
struct Guarded {
    denied: Arc<Denied>,
    /// The last refusal, for the error (the HTTP client's own error says only "dns error").
    refused: Arc<Mutex<Option<String>>>,
}

impl reqwest::dns::Resolve for Guarded {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let denied = self.denied.clone();
        let refused = self.refused.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for a in &addrs {
                if let Some(range) = denied.denies(a.ip()) {
                    let m = internal(&host, a.ip(), range);
                    *refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(m.clone());
                    return Err(m.into());
                }
            }
            let it: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(it)
        })
    }
}

/// One pull's connection to one registry.
pub struct Registry {
    http: reqwest::Client,
    denied: Arc<Denied>,
    refused: Arc<Mutex<Option<String>>>,
    reference: Reference,
    base: Url,
    /// Plain HTTP allowed (the request's `insecure`).
    insecure: bool,
    basic: Option<(String, String)>,
    bearer: Option<String>,
    /// The realm's host, once a challenge named one (credentials may go there too).
    realm_host: Option<String>,
}

impl Registry {
    /// A client for `reference`'s registry, over HTTPS (or plain HTTP when `insecure`).
    pub fn new(
        reference: Reference,
        denied: Denied,
        insecure: bool,
        basic: Option<(String, String)>,
    ) -> Result<Registry, PullError> {
        let denied = Arc::new(denied);
        let refused = Arc::new(Mutex::new(None));
        let http = reqwest::Client::builder()
            .dns_resolver(Arc::new(Guarded {
                denied: denied.clone(),
                refused: refused.clone(),
            }))
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would resolve the names itself, past the check.
            .no_proxy()
            .connect_timeout(std::time::Duration::from_secs(30))
            .read_timeout(std::time::Duration::from_secs(120))
            .user_agent(concat!("warren/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| PullError::Remote(format!("making the registry client: {e}")))?;
        let scheme = if insecure { "http" } else { "https" };
        let host = reference.resolve_registry().to_string();
        let base = Url::parse(&format!("{scheme}://{host}/")).map_err(|_| {
            PullError::Remote(format!(
                "{host:?} is not a registry host: give HOST[:PORT]/REPOSITORY[:TAG]"
            ))
        })?;
        Ok(Registry {
            http,
            denied,
            refused,
            reference,
            base,
            insecure,
            basic,
            bearer: None,
            realm_host: None,
        })
    }

    fn name(&self) -> String {
        self.base.host_str().unwrap_or_default().to_string()
    }

    /// Refuses an address literal in a URL the client would connect to without resolving.
    fn check_url(&self, url: &Url) -> Result<(), PullError> {
        match url.scheme() {
            "https" => {}
            "http" if self.insecure => {}
            s => {
                return Err(PullError::Remote(format!(
                    "the registry {} sent the pull to a {s}: URL; only https (and http with \
                     `insecure`) is followed",
                    self.name()
                )));
            }
        }
        let host = url.host_str().unwrap_or_default();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>()
            && let Some(range) = self.denied.denies(ip)
        {
            return Err(PullError::Internal(internal(host, ip, range)));
        }
        Ok(())
    }

    /// Whether `url` is the registry's own (host and port): its credentials go there.
    fn is_registry(&self, url: &Url) -> bool {
        url.host_str() == self.base.host_str()
            && url.port_or_known_default() == self.base.port_or_known_default()
    }

    /// Whether the basic credentials may go to `url` (the registry, or the realm it named).
    fn trusted(&self, url: &Url) -> bool {
        self.is_registry(url)
            || self
                .realm_host
                .as_deref()
                .is_some_and(|h| url.host_str() == Some(h))
    }

    /// What a failed send becomes: the resolver's refusal when there was one.
    fn transport(&self, what: &str, e: reqwest::Error) -> PullError {
        if let Some(m) = self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return PullError::Internal(m);
        }
        let mut why = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            why = format!("{why}: {s}");
            src = s.source();
        }
        PullError::Remote(format!(
            "{what} from {}: {why}; check the reference's host and port, and `insecure` for a \
             registry without TLS",
            self.name()
        ))
    }

    /// GET `url`, following redirects here (each target checked), with the registry's
    /// credentials where they belong; a 401 from the registry answered once by its challenge.
    async fn get(
        &mut self,
        url: Url,
        accept: Option<&str>,
        what: &str,
    ) -> Result<reqwest::Response, PullError> {
        let mut challenged = false;
        let mut url = url;
        let mut hops = 0;
        loop {
            self.check_url(&url)?;
            let mut rb = self.http.get(url.clone());
            if let Some(a) = accept {
                rb = rb.header(ACCEPT, a);
            }
            if self.is_registry(&url) {
                if let Some(t) = &self.bearer {
                    rb = rb.bearer_auth(t);
                } else if let Some((u, p)) = &self.basic {
                    rb = rb.basic_auth(u, Some(p));
                }
            }
            let resp = rb.send().await.map_err(|e| self.transport(what, e))?;
            let status = resp.status();
            if status.is_redirection() {
                hops += 1;
                let to = resp
                    .headers()
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| url.join(l).ok());
                match to {
                    Some(next) if hops <= MAX_REDIRECTS => {
                        url = next;
                        continue;
                    }
                    Some(_) => {
                        return Err(PullError::Remote(format!(
                            "{what}: the registry {} redirected more than {MAX_REDIRECTS} times",
                            self.name()
                        )));
                    }
                    None => {
                        return Err(PullError::Remote(format!(
                            "{what}: the registry {} answered {status} without a usable Location",
                            self.name()
                        )));
                    }
                }
            }
            if status == StatusCode::UNAUTHORIZED && !challenged && self.is_registry(&url) {
                challenged = true;
                let challenge = resp
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_string);
                if self.answer(challenge.as_deref()).await? {
                    continue;
                }
            }
            if !status.is_success() {
                return Err(self.refusal(what, status));
            }
            return Ok(resp);
        }
    }

    /// The error for an unsuccessful answer: its status and what to check, never its body.
    fn refusal(&self, what: &str, status: StatusCode) -> PullError {
        let hint = match status.as_u16() {
            401 | 403 => "check username and password, and that the key may pull this repository",
            404 => "check the repository and tag",
            429 => "the registry limits pulls: retry later or give credentials",
            _ => "check the reference and that the host is an OCI registry",
        };
        PullError::Remote(format!(
            "{what}: the registry {} answered {status}; {hint}",
            self.name()
        ))
    }

    /// Answers a 401's challenge: a bearer token from the realm it names, or the basic
    /// credentials. Whether to try again.
    async fn answer(&mut self, challenge: Option<&str>) -> Result<bool, PullError> {
        let Some(c) = challenge else {
            return Ok(false);
        };
        let (scheme, params) = c.trim().split_once(' ').unwrap_or((c.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Ok(self.basic.is_some() && self.bearer.is_none());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Ok(false);
        }
        let p = challenge_params(params);
        let Some(realm) = p.iter().find(|(k, _)| k == "realm").map(|(_, v)| v.clone()) else {
            return Ok(false);
        };
        let mut url = Url::parse(&realm).map_err(|_| {
            PullError::Remote(format!(
                "the registry {} named a token service that is not a URL",
                self.name()
            ))
        })?;
        {
            let mut q = url.query_pairs_mut();
            if let Some((_, s)) = p.iter().find(|(k, _)| k == "service") {
                q.append_pair("service", s);
            }
            let scope = p
                .iter()
                .find(|(k, _)| k == "scope")
                .map(|(_, s)| s.clone())
                .unwrap_or_else(|| format!("repository:{}:pull", self.reference.repository()));
            q.append_pair("scope", &scope);
        }
        self.check_url(&url)?;
        self.realm_host = url.host_str().map(str::to_string);
        let token = self.token(url).await?;
        self.bearer = Some(token);
        Ok(true)
    }

    /// A bearer token from the token service at `url` (redirects followed here too).
    async fn token(&mut self, url: Url) -> Result<String, PullError> {
        let what = "getting a pull token";
        let mut url = url;
        for _ in 0..=MAX_REDIRECTS {
            self.check_url(&url)?;
            let mut rb = self.http.get(url.clone());
            if let Some((u, p)) = &self.basic
                && self.trusted(&url)
            {
                rb = rb.basic_auth(u, Some(p));
            }
            let resp = rb.send().await.map_err(|e| self.transport(what, e))?;
            let status = resp.status();
            if status.is_redirection() {
                match resp
                    .headers()
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| url.join(l).ok())
                {
                    Some(next) => {
                        url = next;
                        continue;
                    }
                    None => return Err(self.refusal(what, status)),
                }
            }
            if !status.is_success() {
                return Err(self.refusal(what, status));
            }
            let body = self.document(resp, what).await?;
            let v: serde_json::Value = serde_json::from_slice(&body).map_err(|_| {
                PullError::Remote(format!(
                    "{what}: the token service of {} answered something that is not JSON",
                    self.name()
                ))
            })?;
            return v["token"]
                .as_str()
                .or(v["access_token"].as_str())
                .map(str::to_string)
                .ok_or_else(|| {
                    PullError::Remote(format!(
                        "{what}: the token service of {} answered no token",
                        self.name()
                    ))
                });
        }
        Err(PullError::Remote(format!(
            "{what}: the token service of {} redirected more than {MAX_REDIRECTS} times",
            self.name()
        )))
    }

    /// A whole small answer, at most [`MAX_DOCUMENT`] bytes.
    async fn document(&self, resp: reqwest::Response, what: &str) -> Result<Vec<u8>, PullError> {
        let mut out = Vec::new();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.transport(what, e))?;
            if out.len() + chunk.len() > MAX_DOCUMENT {
                return Err(PullError::Remote(format!(
                    "{what}: the registry {} answered more than {} MiB",
                    self.name(),
                    MAX_DOCUMENT >> 20
                )));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn url(&self, kind: &str, what: &str) -> Result<Url, PullError> {
        self.base
            .join(&format!("v2/{}/{kind}/{what}", self.reference.repository()))
            .map_err(|_| PullError::Remote(format!("{what:?} makes no registry URL")))
    }

    /// The image manifest for this machine's platform (through an index if the reference
    /// names one), its digest checked when the reference or the index gave one, and the
    /// image's config.
    pub async fn manifest_and_config(&mut self) -> Result<(OciImageManifest, String), PullError> {
        let wanted = self
            .reference
            .digest()
            .map(str::to_string)
            .unwrap_or_else(|| self.reference.tag().unwrap_or("latest").to_string());
        let (mut body, mut kind) = self.manifest(&wanted).await?;
        if kind.contains("index") || kind.contains("manifest.list") {
            let index: OciImageIndex = serde_json::from_slice(&body).map_err(|e| {
                PullError::Remote(format!(
                    "the image index of {} is not a valid index (line {}, column {})",
                    self.reference,
                    e.line(),
                    e.column()
                ))
            })?;
            let digest = oci_client::client::current_platform_resolver(&index.manifests)
                .ok_or_else(|| {
                    PullError::Remote(format!(
                        "{} has no image for {}/{}",
                        self.reference,
                        std::env::consts::OS,
                        std::env::consts::ARCH
                    ))
                })?;
            self.check_digest(&digest, "the index")?;
            (body, kind) = self.manifest(&digest).await?;
            if kind.contains("index") || kind.contains("manifest.list") {
                return Err(PullError::Remote(format!(
                    "{}: an index names another index",
                    self.reference
                )));
            }
        }
        let manifest: OciImageManifest = serde_json::from_slice(&body).map_err(|e| {
            PullError::Remote(format!(
                "the manifest of {} is not a valid image manifest (line {}, column {})",
                self.reference,
                e.line(),
                e.column()
            ))
        })?;
        // Digests go into paths, URLs and messages: only well-formed ones, so no text of the
        // registry's is repeated.
        self.check_digest(&manifest.config.digest, "the manifest")?;
        for l in &manifest.layers {
            self.check_digest(&l.digest, "the manifest")?;
        }
        let mut config = Vec::new();
        self.blob(
            &manifest.config.digest,
            &mut config,
            Some(MAX_DOCUMENT as u64),
        )
        .await?;
        let config = String::from_utf8(config).map_err(|_| {
            PullError::Remote(format!("the config of {} is not UTF-8", self.reference))
        })?;
        Ok((manifest, config))
    }

    /// Refuses a digest that is not `sha256:` and 64 lower-case hex digits (without repeating
    /// it).
    fn check_digest(&self, d: &str, from: &str) -> Result<(), PullError> {
        let ok = d.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if ok {
            Ok(())
        } else {
            Err(PullError::Remote(format!(
                "{from} of {} names a digest that is not sha256 and 64 hex digits",
                self.reference
            )))
        }
    }

    /// One manifest or index by tag or digest: its bytes and media type.
    async fn manifest(&mut self, wanted: &str) -> Result<(Vec<u8>, String), PullError> {
        let what = format!("the manifest of {}", self.reference);
        let url = self.url("manifests", wanted)?;
        let resp = self.get(url, Some(MANIFEST_TYPES), &what).await?;
        let header_kind = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|h: &HeaderValue| h.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = self.document(resp, &what).await?;
        if let Some(hex) = wanted.strip_prefix("sha256:") {
            let got = format!("{:x}", sha2::Sha256::digest(&body));
            if got != hex {
                return Err(PullError::Remote(format!(
                    "{what}: its digest is sha256:{got}, not the {wanted} asked for"
                )));
            }
        }
        let kind = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["mediaType"].as_str().map(str::to_string))
            .unwrap_or(header_kind);
        Ok((body, kind))
    }

    /// Streams blob `digest` into `out`, checking its digest; at most `cap` bytes when given.
    pub async fn blob<W: AsyncWrite + Unpin>(
        &mut self,
        digest: &str,
        out: &mut W,
        cap: Option<u64>,
    ) -> Result<(), PullError> {
        self.check_digest(digest, "a blob")?;
        let hex = digest.trim_start_matches("sha256:");
        let what = format!("blob {digest} of {}", self.reference);
        let url = self.url("blobs", digest)?;
        let resp = self.get(url, None, &what).await?;
        let mut hash = sha2::Sha256::new();
        let mut n = 0u64;
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.transport(&what, e))?;
            n += chunk.len() as u64;
            if cap.is_some_and(|c| n > c) {
                return Err(PullError::Remote(format!(
                    "{what} is larger than {} bytes",
                    cap.unwrap_or_default()
                )));
            }
            hash.update(&chunk);
            out.write_all(&chunk).await.map_err(PullError::Write)?;
        }
        let got = format!("{:x}", hash.finalize());
        if got != hex {
            return Err(PullError::Remote(format!(
                "{what}: its content's digest is sha256:{got}"
            )));
        }
        Ok(())
    }
}

/// The `key="value"` (or `key=value`) pairs of a challenge.
fn challenge_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((k, after)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_string(), &q[end + 1..]),
                None => (q.to_string(), ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (after[..end].trim().to_string(), &after[end..]),
                None => (after.trim().to_string(), ""),
            }
        };
        out.push((k, v));
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read_with_and_without_quotes() {
        let p = challenge_params(
            r#"realm="https://auth.docker.io/token",service="registry.docker.io", scope=repository:library/python:pull"#,
        );
        assert_eq!(
            p,
            vec![
                ("realm".into(), "https://auth.docker.io/token".into()),
                ("service".into(), "registry.docker.io".into()),
                ("scope".into(), "repository:library/python:pull".into()),
            ]
        );
        assert!(challenge_params("").is_empty());
    }

    #[test]
    fn digests_are_checked_without_repeating_them() {
        let r: Reference = "registry.example/t/x:1".parse().unwrap();
        let reg = Registry::new(r, Denied::new(&[], &[]), false, None).unwrap();
        let good = format!("sha256:{}", "ab".repeat(32));
        assert!(reg.check_digest(&good, "the manifest").is_ok());
        for bad in [
            "sha256:SECRET",
            "md5:00",
            &format!("sha256:{}", "AB".repeat(32)),
        ] {
            let e = reg
                .check_digest(bad, "the manifest")
                .unwrap_err()
                .to_string();
            assert!(!e.contains("SECRET") && !e.contains("AB"), "{e}");
        }
    }

    #[tokio::test]
    async fn names_and_literals_inside_denied_ranges_are_refused_before_any_connection() {
        let r: Reference = "127.0.0.1:5000/t/x:1".parse().unwrap();
        let mut reg = Registry::new(r, Denied::new(&[], &[]), true, None).unwrap();
        let mut sink = Vec::new();
        let d = format!("sha256:{}", "0".repeat(64));
        let e = reg.blob(&d, &mut sink, None).await.unwrap_err();
        assert!(
            matches!(&e, PullError::Internal(m) if m.contains("registry_exempt")),
            "{e}"
        );
        let r: Reference = "localhost:5000/t/x:1".parse().unwrap();
        let mut reg = Registry::new(r, Denied::new(&[], &[]), true, None).unwrap();
        let e = reg.manifest_and_config().await.unwrap_err();
        assert!(
            matches!(&e, PullError::Internal(m) if m.contains("localhost is")),
            "{e}"
        );
    }
}
