//! `warren-bench iam [N]`: what authorisation costs a request, in the control plane's own
//! code (no HTTP): a key's principal from the cache and the route's check (the create path's
//! `sandbox.create` on its project, and the scope computed for a sandbox route), against the
//! check it replaced — the key's SHA-256 looked up in a set of known hashes — in the same run;
//! and the uncached path (a key read from the database after a change), on SQLite and, where
//! installed, PostgreSQL.

use std::collections::HashSet;
use std::time::Instant;

use warren_control::iam::store::{self, Actor, NewKey};
use warren_control::iam::{Iam, Perm};

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Runs the benchmark; returns its Markdown.
pub async fn run(n: usize) -> anyhow::Result<String> {
    let mut out = String::from(
        "## Authorisation on the request path\n\n\
         Times per request in the control plane's code (no HTTP), microseconds. A key on \
         `root/rl/job-7` (depth 3) of an identity with 3 bindings; 200 projects, 50 keys.\n\n\
         | database | check | p50 µs | p99 µs |\n|---|---|---|---|\n",
    );
    let mut dbs = vec![("SQLite", None)];
    let pg_dir = tempfile::Builder::new()
        .prefix("warren-bench-pg-")
        .tempdir()?;
    let pg = match warren_control::local_pg::binaries() {
        Ok(_) => {
            let path = pg_dir.path().to_path_buf();
            let pg = tokio::task::spawn_blocking(move || {
                warren_control::local_pg::LocalPostgres::start(&path)
            })
            .await?
            .map_err(anyhow::Error::msg)?;
            dbs.push(("PostgreSQL", Some(pg.url.clone())));
            Some(pg)
        }
        Err(_) => None,
    };
    for (name, url) in dbs {
        let dir = tempfile::tempdir()?;
        let url = url
            .unwrap_or_else(|| format!("sqlite://{}?mode=rwc", dir.path().join("b.db").display()));
        let db = warren_control::db::open(&url).await?;
        let admin_secret = warren_control::auth::bootstrap_admin(&db, dir.path())
            .await?
            .expect("a new admin key");
        let admin = store::principal(&db, &warren_control::auth::hash(&admin_secret))
            .await?
            .expect("admin");
        let act = Actor {
            who: &admin,
            source: None,
        };
        for p in ["root/rl", "root/rl/job-7"] {
            store::create_project(&db, act, p).await?;
        }
        for i in 0..198 {
            store::create_project(&db, act, &format!("root/rl/p{i}")).await?;
        }
        store::create_identity(&db, act, "bot", "service", "root/rl").await?;
        for (p, g) in [
            ("root/rl", "viewer"),
            ("root/rl/job-7", "runner"),
            ("root/rl/p1", "builder"),
        ] {
            store::grant(&db, act, "bot", p, g).await?;
        }
        let mut secret = String::new();
        for i in 0..50 {
            let (_, s) = store::create_key(
                &db,
                act,
                NewKey {
                    name: &format!("k{i}"),
                    identity: Some("bot"),
                    project: "root/rl/job-7",
                    role: "runner",
                    expires_ms: None,
                    e2b_form: false,
                },
            )
            .await?;
            secret = s;
        }
        let iam = Iam::new(db.clone()).await?;
        // The peer: the check it replaced.
        let known: HashSet<String> = (0..50)
            .map(|i| warren_control::auth::hash(&format!("wrn_k{i}")))
            .chain([warren_control::auth::hash(&secret)])
            .collect();
        let mut old = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let ok = known.contains(&warren_control::auth::hash(&secret));
            std::hint::black_box(ok);
            old.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let mut create = Vec::with_capacity(n);
        let mut scope = Vec::with_capacity(n);
        iam.authenticate(&secret).await?; // fills the cache
        for _ in 0..n {
            let t = Instant::now();
            let p = iam.authenticate(&secret).await?.expect("key");
            let ok = p.allows(Perm::SandboxCreate, "root/rl/job-7");
            std::hint::black_box(ok);
            create.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            let p = iam.authenticate(&secret).await?.expect("key");
            let s = (p.scope(Perm::SandboxExec), p.scope(Perm::SandboxRead));
            std::hint::black_box(s);
            scope.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let mut cold = Vec::new();
        for _ in 0..(n / 100).max(50) {
            iam.changed();
            let t = Instant::now();
            iam.authenticate(&secret).await?.expect("key");
            cold.push(t.elapsed().as_secs_f64() * 1e6);
        }
        for (what, v) in [
            ("the old check: SHA-256 of the key in a set of hashes", old),
            (
                "create: principal (cached) + sandbox.create on the project",
                create,
            ),
            (
                "sandbox route: principal (cached) + scope of exec and read",
                scope,
            ),
            (
                "principal not cached (after an IAM change): read from the database",
                cold,
            ),
        ] {
            out.push_str(&format!(
                "| {name} | {what} | {:.1} | {:.1} |\n",
                pct(v.clone(), 0.5),
                pct(v, 0.99)
            ));
        }
    }
    drop(pg);
    Ok(out)
}
