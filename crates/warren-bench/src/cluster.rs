//! `warren-bench cluster [SANDBOXES]`: the real control plane — `warren server` (beside this
//! executable) with its API, keys, scheduler, collector and database — against 160 simulated
//! nodes ([`crate::simnode`]) in this process, all on loopback. It prints: sustained
//! creates/s through one control-plane process and through two replicas, placement latency
//! p50/p99, load imbalance (most loaded node against the mean), a 32K-sandbox burst for one
//! task and that task's pause, and a replica restarted to a complete view; and k = 1, 2, 3 and
//! least-loaded-of-all, each with and without the in-flight overlay, in the same run.
//!
//! One machine plays every part: the load generator and the 160 nodes share its cores with
//! the control plane, so the rates are what one control-plane process does with what is left.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use warren_types::id::NodeId;

use crate::simnode::SimNode;

const NODES: usize = 160;
/// The paper's stable point per node, a little over: 160 × 3,200 = 512,000 places.
const PER_NODE: u32 = 3_200;
/// Requests in flight from the load generator.
const CONCURRENCY: usize = 128;

struct Sims {
    nodes: Vec<Arc<SimNode>>,
    urls: Vec<String>,
}

async fn start_sims(token: &str, latency: Duration) -> anyhow::Result<Sims> {
    let mut nodes = Vec::new();
    let mut urls = Vec::new();
    for i in 0..NODES {
        let id: NodeId = format!("s{i:05}").parse()?;
        let sim = SimNode::new(id, PER_NODE, latency);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        urls.push(format!("http://{}", listener.local_addr()?));
        let app = crate::simnode::router(sim.clone(), token.to_string());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        nodes.push(sim);
    }
    Ok(Sims { nodes, urls })
}

struct Server {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    log: PathBuf,
}

impl Server {
    /// Its resident memory, MiB (0 when not running).
    fn rss_mib(&self) -> u64 {
        let Some(c) = &self.child else { return 0 };
        std::fs::read_to_string(format!("/proc/{}/status", c.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    }

    fn start(exe: &Path, data: &Path, config: &str, log: PathBuf) -> anyhow::Result<Server> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let cfg = data.join(format!("config-{port}.toml"));
        std::fs::create_dir_all(data)?;
        std::fs::write(&cfg, config)?;
        let args = vec![
            "server".to_string(),
            "--data-dir".into(),
            data.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--config".into(),
            cfg.display().to_string(),
        ];
        let mut s = Server {
            child: None,
            port,
            args,
            log,
        };
        s.spawn(exe)?;
        Ok(s)
    }

    fn spawn(&mut self, exe: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        self.child = Some(
            Command::new(exe)
                .args(&self.args)
                .env("WARREN_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "warren server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY * 2)
        .tcp_nodelay(true)
        .build()
        .expect("client")
}

/// Joins every simulated node through the real join path (the control plane calls each back).
async fn join_all(server: &str, token: &str, sims: &Sims) -> anyhow::Result<()> {
    let h = http();
    for (sim, url) in sims.nodes.iter().zip(&sims.urls) {
        let r = h
            .post(format!("{server}/v1/cluster/nodes"))
            .bearer_auth(token)
            .json(&serde_json::json!({"id": sim.id, "url": url, "version": "sim"}))
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "join: {}", r.text().await?);
    }
    Ok(())
}

struct Burst {
    made: usize,
    refused: usize,
    elapsed: Duration,
    latencies_ms: Vec<f64>,
}

/// `n` creates of task `task` through `servers` (round robin), `CONCURRENCY` at a time.
async fn burst(servers: &[String], key: &str, n: usize, task: &str) -> Burst {
    burst_keyed(servers, key, n, task, false).await
}

/// [`burst`], each create with an `Idempotency-Key` of its own when `keyed` (as the Python
/// SDK sends).
async fn burst_keyed(servers: &[String], key: &str, n: usize, task: &str, keyed: bool) -> Burst {
    let h = http();
    let next = Arc::new(AtomicUsize::new(0));
    let body = serde_json::json!({"image": "host", "task": task});
    let t = Instant::now();
    let workers = (0..CONCURRENCY).map(|w| {
        let (h, next, body) = (h.clone(), next.clone(), body.clone());
        let url = format!("{}/v1/sandboxes", servers[w % servers.len()]);
        let key = key.to_string();
        let task = task.to_string();
        tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut refused = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t = Instant::now();
                let mut rb = h.post(&url).bearer_auth(&key).json(&body);
                if keyed {
                    rb = rb.header("Idempotency-Key", format!("{task}-{i}"));
                }
                match rb.send().await {
                    Ok(r) if r.status().as_u16() == 201 => {
                        let _ = r.bytes().await;
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                    Ok(r) => {
                        let _ = r.bytes().await;
                        refused += 1;
                    }
                    Err(_) => refused += 1,
                }
            }
            (lat, refused)
        })
    });
    let mut out = Burst {
        made: 0,
        refused: 0,
        elapsed: Duration::ZERO,
        latencies_ms: Vec::new(),
    };
    for r in futures_util::future::join_all(workers).await {
        let (lat, refused) = r.unwrap_or_default();
        out.made += lat.len();
        out.refused += refused;
        out.latencies_ms.extend(lat);
    }
    out.elapsed = t.elapsed();
    out.latencies_ms.sort_by(f64::total_cmp);
    out
}

fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

/// Most loaded node against the mean.
fn imbalance(sims: &Sims) -> f64 {
    let counts: Vec<usize> = sims.nodes.iter().map(|n| n.count()).collect();
    let total: usize = counts.iter().sum();
    if total == 0 {
        return f64::NAN;
    }
    *counts.iter().max().unwrap_or(&0) as f64 / (total as f64 / counts.len() as f64)
}

fn config(k: usize, overlay: bool) -> String {
    format!(
        "[control]\nschedule_k = {k}\nschedule_overlay = {overlay}\ncollect_interval_ms = 1000\n"
    )
}

fn read_token(data: &Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(data.join("cluster.token"))?
        .trim()
        .to_string())
}

fn read_key(data: &Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(data.join("admin.key"))?
        .trim()
        .to_string())
}

/// Waits until `server` lists every node answering with `total` sandboxes in all; returns
/// how long that took.
async fn complete_view(server: &str, key: &str, total: usize) -> anyhow::Result<Duration> {
    let h = http();
    let t = Instant::now();
    loop {
        if let Ok(r) = h
            .get(format!("{server}/v1/nodes"))
            .bearer_auth(key)
            .send()
            .await
            && let Ok(v) = r.json::<serde_json::Value>().await
            && let Some(nodes) = v["nodes"].as_array()
        {
            let up = nodes.iter().filter(|n| n["reachable"] == true).count();
            let sum: u64 = nodes.iter().filter_map(|n| n["sandboxes"].as_u64()).sum();
            if up == NODES && sum as usize == total {
                return Ok(t.elapsed());
            }
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "no complete view in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn run(exe_dir: &Path, total: usize) -> anyhow::Result<String> {
    let exe = exe_dir.join("warren");
    anyhow::ensure!(
        exe.is_file(),
        "{} is missing: build the workspace",
        exe.display()
    );
    let work = tempfile::Builder::new()
        .prefix("warren-bench-cluster.")
        .tempdir()?;
    let data = work.path().join("control");
    let mut out = format!(
        "## The control plane against {NODES} simulated nodes\n\n\
         One `warren server` process (SQLite, collector every 1 s) and {NODES} simulated nodes \
         ({PER_NODE} places each, creates answered at once) in the benchmark process, {CONCURRENCY} \
         creates in flight, all on this machine's cores.\n\n"
    );

    // Main run: k = 2 with the overlay (the defaults), `total` sandboxes.
    let mut server = Server::start(
        &exe,
        &data,
        &config(2, true),
        work.path().join("server.log"),
    )?;
    let token = read_token(&data)?;
    let key = read_key(&data)?;
    let sims = start_sims(&token, Duration::ZERO).await?;
    join_all(&server.url(), &token, &sims).await?;
    let b = burst(&[server.url()], &key, total, "main").await;
    out.push_str(
        "| run | sandboxes made | refused | time | creates/s | placement p50 | p99 | imbalance (max/mean) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let row = |name: &str, b: &Burst, imb: f64| {
        format!(
            "| {name} | {} | {} | {:.1} s | {:.0} | {:.1} ms | {:.1} ms | {imb:.3} |\n",
            b.made,
            b.refused,
            b.elapsed.as_secs_f64(),
            b.made as f64 / b.elapsed.as_secs_f64(),
            pct(&b.latencies_ms, 0.5),
            pct(&b.latencies_ms, 0.99),
        )
    };
    out.push_str(&row(
        "one control plane, k=2 + overlay",
        &b,
        imbalance(&sims),
    ));
    let made_main = b.made;

    // A 32K burst for one task, then its pause.
    let b32 = burst(&[server.url()], &key, 32_000, "t32k").await;
    out.push_str(&row(
        "32K burst of one task (on top)",
        &b32,
        imbalance(&sims),
    ));
    let h = http();
    let t = Instant::now();
    let r = h
        .post(format!("{}/v1/tasks/t32k/pause", server.url()))
        .bearer_auth(&key)
        .send()
        .await?;
    let pause = t.elapsed();
    let v: serde_json::Value = r.json().await?;
    let paused = v["succeeded"].as_u64().unwrap_or(0);

    // The replica killed and started again: how long to a complete view.
    let held = made_main + b32.made;
    server.kill();
    server.spawn(&exe)?;
    let view = complete_view(&server.url(), &key, held).await?;
    // What holding every node's sandboxes costs it (its view of them is built by then: the
    // first poll, before it answers, fetches each node's whole set).
    let rss = server.rss_mib();

    // Two replicas on the same database.
    for s in &sims.nodes {
        s.clear();
    }
    let mut second = Server::start(
        &exe,
        &data,
        &config(2, true),
        work.path().join("server2.log"),
    )?;
    complete_view(&second.url(), &key, 0).await?;
    let b2 = burst(&[server.url(), second.url()], &key, total, "two").await;
    out.push_str(&row(
        "two control planes, k=2 + overlay",
        &b2,
        imbalance(&sims),
    ));
    second.kill();
    out.push_str(&format!(
        "\nTask pause of the 32K task: {:.2} s ({paused} sandboxes paused, one request per node). \
         Replica killed (SIGKILL) and started again with {held} sandboxes on the nodes: complete \
         view (every node answering, every sandbox counted) {:.2} s after its start; its \
         resident memory then, holding the view of those sandboxes: {rss} MiB.\n",
        pause.as_secs_f64(),
        view.as_secs_f64()
    ));
    server.kill();

    // The comparison: k and the overlay.
    let n = (total / 4).max(NODES * 10);
    out.push_str(&format!(
        "\n### Placement policies, {n} creates each (same nodes, cleared between runs)\n\n\
         | policy | overlay | creates/s | placement p50 | p99 | imbalance (max/mean) |\n\
         |---|---|---|---|---|---|\n"
    ));
    for overlay in [true, false] {
        for (name, k) in [
            ("k=1 (random)", 1),
            ("k=2", 2),
            ("k=3", 3),
            ("least loaded of all", NODES),
        ] {
            for s in &sims.nodes {
                s.clear();
            }
            let mut s = Server::start(
                &exe,
                &data,
                &config(k, overlay),
                work.path().join("cmp.log"),
            )?;
            complete_view(&s.url(), &key, 0).await?;
            let b = burst(&[s.url()], &key, n, "cmp").await;
            out.push_str(&format!(
                "| {name} | {} | {:.0} | {:.1} ms | {:.1} ms | {:.3} |\n",
                if overlay { "on" } else { "off" },
                b.made as f64 / b.elapsed.as_secs_f64(),
                pct(&b.latencies_ms, 0.5),
                pct(&b.latencies_ms, 0.99),
                imbalance(&sims)
            ));
            s.kill();
        }
    }
    // Keyed creates (the Python SDK keys every create): the key's node recorded in the
    // database first — SQLite, and PostgreSQL where it is installed.
    let pg_dir = tempfile::Builder::new()
        .prefix("warren-bench-pg.")
        .tempdir()?;
    let pg = match warren_control::local_pg::binaries() {
        Ok(_) => {
            let dir = pg_dir.path().to_path_buf();
            Some(
                tokio::task::spawn_blocking(move || {
                    warren_control::local_pg::LocalPostgres::start(&dir)
                })
                .await?
                .map_err(anyhow::Error::msg)?,
            )
        }
        Err(why) => {
            out.push_str(&format!(
                "| (keyed on PostgreSQL not run: {why}) | | | | | |\n"
            ));
            None
        }
    };
    let mut dbs = vec![("SQLite", None)];
    if let Some(pg) = &pg {
        dbs.push(("PostgreSQL", Some(pg.url.clone())));
    }
    for (name, url) in dbs {
        for s in &sims.nodes {
            s.clear();
        }
        let mut cfg = config(2, true);
        if let Some(u) = &url {
            cfg.push_str(&format!("database_url = {u:?}\n"));
        }
        let mut s = Server::start(&exe, &data, &cfg, work.path().join("keyed.log"))?;
        if url.is_some() {
            // A database of its own: the nodes join it.
            join_all(&s.url(), &token, &sims).await?;
        }
        complete_view(&s.url(), &key, 0).await?;
        let b = burst_keyed(&[s.url()], &key, n, "keyed", true).await;
        out.push_str(&format!(
            "| k=2, every create keyed, keys recorded in {name} | on | {:.0} | {:.1} ms | {:.1} ms | {:.3} |\n",
            b.made as f64 / b.elapsed.as_secs_f64(),
            pct(&b.latencies_ms, 0.5),
            pct(&b.latencies_ms, 0.99),
            imbalance(&sims)
        ));
        s.kill();
    }
    drop(pg);
    out.push_str(
        "\nWithout the overlay every choice between two polls sees the same reports, so the \
         least-loaded node of those drawn takes a burst's whole share until the next poll: \
         least-loaded-of-all sends everything to one node at a time.\n",
    );
    Ok(out)
}
