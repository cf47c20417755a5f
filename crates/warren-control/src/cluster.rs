//! Cluster membership: nodes join over the network with the cluster token and say, every
//! heartbeat, that they are still there; the membership (where each node is, whether it is
//! cordoned) lives in the database, which every replica reads, so a node that joined through
//! one replica is polled by all and a restarted replica knows every node at once. What the
//! nodes run and how loaded they are is never stored: the collector polls it from them.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;
use warren_types::api::{NodeInfo, NodeRegistered, NodeRegistration};
use warren_types::error::{ApiError, ErrorCode};
use warren_types::id::NodeId;

use crate::Control;
use crate::node_api::NodeApi;
use crate::nodes::{Endpoint, NodeClient, Nodes};

/// How long a registering node has to answer the control plane's call back.
const CALL_BACK: Duration = Duration::from_secs(5);

/// The cluster token: read from `path`, or made there (mode 0600) when it does not exist.
/// Nodes present it to join; the control plane presents it to the nodes' APIs.
pub fn load_or_make_token(path: &Path) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(m) = std::fs::metadata(path)
                && m.permissions().mode() & 0o077 != 0
            {
                tracing::warn!(
                    "{} is readable by others (mode {:o}): chmod 600 it; whoever holds the \
                     cluster token controls every node",
                    path.display(),
                    m.permissions().mode() & 0o777
                );
            }
            let t = t.trim().to_string();
            if t.len() < 16 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: the cluster token is shorter than 16 characters; delete the file \
                         to have a new one made",
                        path.display()
                    ),
                ));
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = crate::auth::new_key().replacen("wrn_", "wct_", 1);
            // A fresh file of a random name (never one that exists, never through a link),
            // then linked into place only if nothing is there yet: two replicas starting at
            // once on one data directory end up with the same token, the first one's.
            let dir = path.parent().unwrap_or(Path::new("."));
            let tmp = dir.join(format!(".cluster.token.{:016x}", rand::random::<u64>()));
            let written = (|| {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(format!("{token}\n").as_bytes())?;
                f.sync_all()?;
                std::fs::hard_link(&tmp, path)
            })();
            let _ = std::fs::remove_file(&tmp);
            match written {
                Ok(()) => Ok(token),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => load_or_make_token(path),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Checks the URL a node says it is reached at: `http(s)://host:port`, nothing more.
fn check_url(url: &str) -> Result<String, ApiError> {
    let bad = |why: &str| {
        ApiError::invalid(format!(
            "url {url:?} {why}: give where the control plane reaches the node's API, \
             http://HOST:PORT (warren node --advertise)"
        ))
    };
    if url.len() > 512 {
        return Err(bad("is longer than 512 bytes"));
    }
    let u = reqwest::Url::parse(url).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad("is not http or https"));
    }
    if u.host_str().is_none_or(str::is_empty) || u.port_or_known_default().is_none() {
        return Err(bad("has no host"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("holds a user name or password"));
    }
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() {
        return Err(bad("has a path, query or fragment"));
    }
    // The parsed form: what the parser dropped (tabs, newlines) is not stored or logged.
    Ok(u.as_str().trim_end_matches('/').to_string())
}

/// The cluster's addresses, resolved again when the nodes change or after
/// [`ADDRESSES_TTL`]: when, for which node URLs, and what they resolved to.
#[derive(Default)]
pub struct ClusterAddresses(tokio::sync::Mutex<Option<Resolved>>);

type Resolved = (std::time::Instant, Vec<String>, Vec<std::net::IpAddr>);

/// How long the resolved cluster addresses are kept.
const ADDRESSES_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// The hosts of the database's URL (PostgreSQL's; SQLite has none) and of every node's.
pub fn cluster_hosts(database_url: &str, node_urls: &[String]) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    let db = database_url
        .strip_prefix("postgres://")
        .or_else(|| database_url.strip_prefix("postgresql://"));
    if let Some(rest) = db {
        // user:password@host:port/db?options — the host is between the last '@' of the
        // authority and the path.
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let hostport = authority.rsplit('@').next().unwrap_or_default();
        if let Ok(u) = reqwest::Url::parse(&format!("postgres://{hostport}/"))
            && let Some(h) = u.host_str()
            && !h.is_empty()
        {
            out.push((h.to_string(), u.port().unwrap_or(5432)));
        }
    }
    for n in node_urls {
        if let Ok(u) = reqwest::Url::parse(n)
            && let Some(h) = u.host_str()
        {
            out.push((h.to_string(), u.port_or_known_default().unwrap_or(80)));
        }
    }
    out
}

/// What joined nodes deny their sandboxes besides the fixed ranges: the addresses of the
/// database and of every node, resolved here (cached for [`ADDRESSES_TTL`]). A name that
/// does not resolve is left out (and so is a replica of the control plane that no node's
/// `--join` names: the control plane does not know its replicas' addresses).
pub async fn cluster_addresses(c: &Control) -> Vec<std::net::IpAddr> {
    let mut urls: Vec<String> = c
        .nodes
        .all()
        .iter()
        .filter_map(|n| n.address.clone())
        .collect();
    urls.sort();
    let mut cache = c.cluster_addresses.0.lock().await;
    if let Some((at, for_urls, v)) = cache.as_ref()
        && at.elapsed() < ADDRESSES_TTL
        && *for_urls == urls
    {
        return v.clone();
    }
    let mut out: Vec<std::net::IpAddr> = Vec::new();
    for (host, port) in cluster_hosts(&c.cfg.database_url(), &urls) {
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
            out.push(ip);
            continue;
        }
        let looked = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::net::lookup_host((bare.as_str(), port)),
        )
        .await;
        if let Ok(Ok(addrs)) = looked {
            out.extend(addrs.map(|a| a.ip()));
        }
    }
    out.sort();
    out.dedup();
    *cache = Some((std::time::Instant::now(), urls, out.clone()));
    out
}

/// `POST /v1/cluster/nodes`: a node joins, or says it is still there.
///
/// A node new to the cluster, or at a new address, is called back at the URL it gave and
/// must answer with the id it claims: so a registration cannot point a node's id at an
/// address where another answers. An id whose recorded node still answers as that id at its
/// recorded address (the database's, shared by replicas) is refused (409): two nodes made from
/// one state directory, or someone claiming a live node's id.
pub async fn register(c: &Control, reg: NodeRegistration) -> Result<NodeRegistered, ApiError> {
    let url = check_url(&reg.url)?;
    if reg.version.len() > 64 || reg.version.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "version must be at most 64 bytes without control characters",
        ));
    }
    let answer = NodeRegistered {
        heartbeat_ms: c.cfg.heartbeat_ms(),
        deny: cluster_addresses(c).await,
    };
    // The heartbeat of a node known here at this address: one write.
    let known_here = c
        .nodes
        .get(&reg.id)
        .is_some_and(|n| n.address.as_deref() == Some(url.as_str()));
    if known_here {
        let done =
            sqlx::query("UPDATE nodes SET seen_ms = $1, version = $2 WHERE id = $3 AND url = $4")
                .bind(now_ms())
                .bind(&reg.version)
                .bind(reg.id.as_str())
                .bind(&url)
                .execute(&c.db)
                .await
                .map_err(db_error)?;
        if done.rows_affected() == 1 {
            return Ok(answer);
        }
        // The row is gone (a database reset, a removal) or says another address: join again.
    }
    let recorded: Option<String> = sqlx::query("SELECT url FROM nodes WHERE id = $1")
        .bind(reg.id.as_str())
        .fetch_optional(&c.db)
        .await
        .map_err(db_error)?
        .map(|r| r.try_get::<String, _>(0))
        .transpose()
        .map_err(db_error)?;
    if let Some(old) = recorded.filter(|old| *old != url) {
        // Whoever holds the id now: asked at its recorded address (warren up's own node on
        // its socket), and if it answers as that id, the claim is refused.
        let old_endpoint = match old.strip_prefix("unix:") {
            Some(p) => Endpoint::Unix(p.into()),
            None => Endpoint::Http {
                url: old.clone(),
                token: Some(c.cluster_token.clone()),
            },
        };
        if let Ok(client) = NodeClient::new(&old_endpoint)
            && let Ok(info) = timeout_info(&client, c).await
            && info.id == reg.id
        {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "node {} already answers at {old}, so a second node claims its id from \
                     {url}: each node needs a state directory of its own (the id is made \
                     there); stop one of them",
                    reg.id
                ),
            ));
        }
    }
    let endpoint = Endpoint::Http {
        url: url.clone(),
        token: Some(c.cluster_token.clone()),
    };
    let client = NodeClient::new(&endpoint).map_err(|e| ApiError::invalid(e.to_string()))?;
    let info = timeout_info(&client, c).await.map_err(|e| {
        tracing::info!(node_id = %reg.id, %url, "a join could not be called back: {e}");
        ApiError::invalid(format!(
            "the control plane could not reach node {} at {url} ({}); advertise an address it \
             can reach (warren node --advertise), with the same cluster token",
            reg.id,
            short(&e)
        ))
    })?;
    if info.id != reg.id {
        return Err(ApiError::invalid(format!(
            "node {} answers at {url}, not node {}: advertise this node's own address",
            info.id, reg.id
        )));
    }
    let now = now_ms();
    let cordoned = sqlx::query(
        "INSERT INTO nodes (id, url, cordoned, version, joined_ms, seen_ms) \
         VALUES ($1, $2, 0, $3, $4, $5) \
         ON CONFLICT (id) DO UPDATE SET url = excluded.url, version = excluded.version, \
         seen_ms = excluded.seen_ms RETURNING cordoned",
    )
    .bind(reg.id.as_str())
    .bind(&url)
    .bind(&reg.version)
    .bind(now)
    .bind(now)
    .fetch_one(&c.db)
    .await
    .map_err(db_error)?
    .try_get::<i64, _>(0)
    .map_err(db_error)?
        != 0;
    let entry = c
        .nodes
        .add_unheard(reg.id.clone(), &endpoint, cordoned)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    entry.record(info, std::time::Instant::now());
    entry.set_up(true);
    tracing::info!(node_id = %reg.id, %url, "node joined");
    Ok(answer)
}

/// The first 200 characters of a call-back's failure, for the joining node's operator.
fn short(e: &str) -> String {
    match e.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &e[..i]),
        None => e.to_string(),
    }
}

async fn timeout_info(client: &NodeClient, c: &Control) -> Result<NodeInfo, String> {
    let api = NodeApi::new(client, c.cfg.node_timeouts());
    match tokio::time::timeout(CALL_BACK, api.info()).await {
        Ok(Ok(i)) => Ok(i),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", CALL_BACK.as_secs())),
    }
}

fn db_error(e: sqlx::Error) -> ApiError {
    tracing::error!("database: {e}");
    ApiError::new(
        ErrorCode::Unavailable,
        "the control plane's database does not answer; retry shortly",
    )
}

/// Records `warren up`'s own node (reached on a unix socket) in the membership, so that it
/// can be cordoned like any other.
pub async fn record_local_in(
    db: &crate::db::Db,
    id: &NodeId,
    path: &Path,
) -> Result<bool, sqlx::Error> {
    let now = now_ms();
    let row = sqlx::query(
        "INSERT INTO nodes (id, url, cordoned, version, joined_ms, seen_ms) \
         VALUES ($1, $2, 0, $3, $4, $5) \
         ON CONFLICT (id) DO UPDATE SET url = excluded.url, seen_ms = excluded.seen_ms \
         RETURNING cordoned",
    )
    .bind(id.as_str())
    .bind(format!("unix:{}", path.display()))
    .bind(env!("CARGO_PKG_VERSION"))
    .bind(now)
    .bind(now)
    .fetch_one(db)
    .await?;
    Ok(row.try_get::<i64, _>(0)? != 0)
}

/// Reads the membership: nodes this replica does not know yet (another replica's joins, or
/// every node after a restart) are added and polled from then on; cordons are brought up to
/// date. A node that stops answering is never dropped (it is listed as unreachable); one
/// removed from the membership (`DELETE /v1/nodes/{node}`) is.
pub async fn sync(nodes: &Nodes, db: &crate::db::Db, token: &str) -> Result<(), sqlx::Error> {
    // Taken before the read: a node that joins meanwhile is not in it, so it is not taken
    // for one removed.
    let before = nodes.all();
    let rows = sqlx::query("SELECT id, url, cordoned FROM nodes")
        .fetch_all(db)
        .await?;
    let mut listed = std::collections::HashSet::new();
    for row in &rows {
        if let Ok(id) = row.try_get::<String, _>(0) {
            listed.insert(id);
        }
    }
    // Joined nodes removed from the membership (through any replica) are forgotten here too;
    // `warren up`'s own node is always in it.
    for n in before {
        if n.address.is_some() && !listed.contains(n.id.as_str()) && nodes.remove_entry(&n) {
            tracing::info!(node_id = %n.id, "node no longer in the membership");
        }
    }
    for row in rows {
        let id: String = row.try_get(0)?;
        let url: String = row.try_get(1)?;
        let cordoned = row.try_get::<i64, _>(2)? != 0;
        let Ok(id) = id.parse::<NodeId>() else {
            continue;
        };
        match nodes.get(&id) {
            Some(n) if n.address.as_deref() == Some(url.as_str()) || url.starts_with("unix:") => {
                n.set_cordoned(cordoned);
            }
            _ if url.starts_with("unix:") => {}
            _ => {
                let endpoint = Endpoint::Http {
                    url: url.clone(),
                    token: Some(token.to_string()),
                };
                match nodes.add_unheard(id.clone(), &endpoint, cordoned) {
                    Ok(n) => {
                        tracing::info!(node_id = %id, %url, "node known from the membership");
                        // Asked at once, not at the next poll: until it has answered it is
                        // not a candidate for placement.
                        tokio::spawn(async move {
                            let asked = std::time::Instant::now();
                            if let Ok(info) = n.api().info().await
                                && info.id == n.id
                            {
                                n.record(info, asked);
                                n.set_up(true);
                            }
                        });
                    }
                    Err(e) => tracing::warn!(node_id = %id, "membership: {e}"),
                }
            }
        }
    }
    Ok(())
}

/// Reads the membership every `interval` until the control plane is dropped.
pub fn spawn_sync(nodes: &Arc<Nodes>, db: crate::db::Db, token: String, interval: Duration) {
    let nodes = Arc::downgrade(nodes);
    tokio::spawn(async move {
        let mut failing = false;
        let mut last_expiry = std::time::Instant::now();
        loop {
            let Some(n) = nodes.upgrade() else { break };
            // Keys of creates older than a day, once a minute.
            if last_expiry.elapsed() >= Duration::from_secs(60) {
                last_expiry = std::time::Instant::now();
                if let Err(e) = crate::create_keys::expire(&db).await {
                    tracing::debug!("create keys: {e}");
                }
            }
            match sync(&n, &db, &token).await {
                Ok(()) if failing => {
                    tracing::info!("membership: the database answers again");
                    failing = false;
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    tracing::warn!("membership: the database does not answer: {e}");
                    failing = true;
                }
                Err(_) => {}
            }
            drop(n);
            tokio::time::sleep(interval).await;
        }
    });
}

/// Node `id` of the cluster, or why not (a malformed id: 400; an unknown one: 404).
fn known(c: &Control, id: &str) -> Result<(NodeId, Arc<crate::nodes::NodeEntry>), ApiError> {
    let id: NodeId = id
        .parse()
        .map_err(|e| ApiError::invalid(format!("{e}; node ids are in warren node ls")))?;
    match c.nodes.get(&id) {
        Some(node) => Ok((id, node)),
        None => Err(ApiError::new(
            ErrorCode::NotFound,
            format!("node {id} is not part of this cluster; see warren node ls"),
        )),
    }
}

/// Keeps new sandboxes off node `id`, or lets them on again; every replica learns it at its
/// next membership read.
pub async fn set_cordon(c: &Control, id: &str, on: bool) -> Result<NodeInfo, ApiError> {
    let (id, node) = known(c, id)?;
    let done = sqlx::query("UPDATE nodes SET cordoned = $1 WHERE id = $2")
        .bind(i64::from(on))
        .bind(id.as_str())
        .execute(&c.db)
        .await
        .map_err(db_error)?;
    if done.rows_affected() == 0 {
        // Removed through another replica since this one last read the membership.
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("node {id} is no longer part of this cluster; see warren node ls"),
        ));
    }
    node.set_cordoned(on);
    tracing::info!(node_id = %id, cordoned = on, "cordon");
    Ok(node.info())
}

/// Removes node `id` from the cluster for good (a machine retired). Refused while it answers:
/// drain and stop it first. Every replica forgets it at its next membership read.
pub async fn remove(c: &Control, id: &str) -> Result<(), ApiError> {
    let (id, node) = known(c, id)?;
    if node.address.is_none() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("node {id} is this control plane's own (warren up): it cannot be removed"),
        ));
    }
    if let Ok(info) = timeout_info(&node.client, c).await
        && info.id == id
    {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "node {id} still answers, with {} sandboxes: drain and stop it first \
                 (warren node drain {id} --kill), then remove it",
                info.sandboxes
            ),
        ));
    }
    sqlx::query("DELETE FROM nodes WHERE id = $1")
        .bind(id.as_str())
        .execute(&c.db)
        .await
        .map_err(db_error)?;
    c.nodes.remove(&id);
    tracing::info!(node_id = %id, "node removed from the cluster");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_hosts_are_the_databases_and_the_nodes() {
        let h = super::cluster_hosts(
            "postgres://warren:p@ss@db.internal:6432/warren?sslmode=require",
            &[
                "http://10.0.0.7:7702".into(),
                "http://[fd00::7]:7702".into(),
            ],
        );
        assert_eq!(
            h,
            vec![
                ("db.internal".to_string(), 6432),
                ("10.0.0.7".to_string(), 7702),
                ("[fd00::7]".to_string(), 7702),
            ]
        );
        assert!(super::cluster_hosts("sqlite:///var/lib/warren/warren.db", &[]).is_empty());
        assert_eq!(
            super::cluster_hosts("postgresql://db/warren", &[]),
            vec![("db".to_string(), 5432)]
        );
    }

    #[test]
    fn urls_are_host_and_port_only() {
        assert_eq!(
            check_url("http://10.0.0.5:7702/").unwrap(),
            "http://10.0.0.5:7702"
        );
        assert_eq!(
            check_url("https://node-a:7702").unwrap(),
            "https://node-a:7702"
        );
        for bad in [
            "ftp://a:1",
            "http://",
            "http://u:p@a:1",
            "http://a:1/path",
            "http://a:1/?q=1",
            "unix:/run/x.sock",
            "not a url",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        assert!(check_url(&format!("http://{}:1", "a".repeat(600))).is_err());
        // What the parser drops is not kept.
        assert_eq!(
            check_url("http://10.0.0.5:77\n02").unwrap(),
            "http://10.0.0.5:7702"
        );
    }

    #[test]
    fn the_token_is_made_once_and_kept() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("cluster.token");
        let a = load_or_make_token(&p).unwrap();
        assert!(a.starts_with("wct_") && a.len() >= 36, "{a}");
        assert_eq!(load_or_make_token(&p).unwrap(), a);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&p, "short\n").unwrap();
        assert!(load_or_make_token(&p).is_err());
    }

    #[tokio::test]
    async fn the_membership_reads_back_on_each_database() {
        use crate::node_api::Timeouts;
        for t in crate::db::testing::each().await {
            let db = &t.db;
            let local: NodeId = "aaaaaa".parse().unwrap();
            let sock = std::path::Path::new("/nonexistent/node.sock");
            assert!(!record_local_in(db, &local, sock).await.unwrap());
            // A node another replica let join.
            sqlx::query(
                "INSERT INTO nodes (id, url, cordoned, version, joined_ms, seen_ms) \
                 VALUES ($1, $2, 1, 'x', $3, $3)",
            )
            .bind("bbbbbb")
            .bind("http://127.0.0.1:9")
            .bind(now_ms())
            .execute(db)
            .await
            .unwrap();
            let nodes = Nodes::new(Timeouts::default());
            sync(&nodes, db, "wct_token-of-sixteen").await.unwrap();
            // The local node is the caller's to add (on its socket), never from the table.
            assert_eq!(nodes.all().len(), 1);
            let b = nodes.get(&"bbbbbb".parse().unwrap()).unwrap();
            assert!(b.is_cordoned() && !b.is_up());
            assert_eq!(b.address.as_deref(), Some("http://127.0.0.1:9"));
            // Uncordoned in the table: the next read says so.
            sqlx::query("UPDATE nodes SET cordoned = 0 WHERE id = $1")
                .bind("bbbbbb")
                .execute(db)
                .await
                .unwrap();
            sync(&nodes, db, "wct_token-of-sixteen").await.unwrap();
            assert!(!b.is_cordoned());
            // The local node's record keeps its cordon across starts.
            sqlx::query("UPDATE nodes SET cordoned = 1 WHERE id = $1")
                .bind("aaaaaa")
                .execute(db)
                .await
                .unwrap();
            assert!(record_local_in(db, &local, sock).await.unwrap());
            // Removed from the table: forgotten at the next read.
            sqlx::query("DELETE FROM nodes WHERE id = $1")
                .bind("bbbbbb")
                .execute(db)
                .await
                .unwrap();
            sync(&nodes, db, "wct_token-of-sixteen").await.unwrap();
            assert!(nodes.all().is_empty());
        }
    }
}
