//! The sandbox lifecycle end to end through the REST API, and how it refuses bad input.

mod common;

use std::collections::BTreeMap;

use common::Platform;
use serde_json::{Value, json};
use warren_sdk::{ByteSize, CreateSandbox, ErrorCode, ListFilter, SandboxState, argv};

fn host() -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_list_pause_resume_kill() {
    require_root!();
    let p = Platform::start();
    let c = p.client();

    let labels: BTreeMap<String, String> = [("team".to_string(), "rl".to_string())].into();
    let a = c
        .create(&CreateSandbox {
            task: Some("task-a".into()),
            labels: labels.clone(),
            cpu: Some(500),
            memory: Some(ByteSize(256 << 20)),
            memory_limit: Some(ByteSize(256 << 20)),
            pids: Some(128),
            timeout: Some(600),
            ..host()
        })
        .await
        .unwrap();
    let b = c
        .create(&CreateSandbox {
            task: Some("task-b".into()),
            ..host()
        })
        .await
        .unwrap();

    // Ids are DNS labels of lower-case letters and digits, and encode their node.
    let id = a.id().to_string();
    assert_eq!(id.len(), 20);
    assert!(
        id.bytes()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit()),
        "{id}"
    );
    let info = a.info().await.unwrap();
    assert_eq!(info.node.as_str(), &id[..6]);
    assert_eq!(info.resources.cpu, 500);
    assert_eq!(info.resources.memory, ByteSize(256 << 20));
    assert_eq!(info.resources.pids, 128);
    assert_eq!(info.state, SandboxState::Running);
    assert_eq!(info.backend, warren_sdk::BackendKind::Container);
    let nodes = c.nodes().await.unwrap();
    assert_eq!(nodes[0].backends, vec![warren_sdk::BackendKind::Container]);

    // The limits are real cgroup limits.
    let mem = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/{}/{id}/memory.limit_in_bytes",
        p.cgroup_parent
    ))
    .or_else(|_| {
        std::fs::read_to_string(format!(
            "/sys/fs/cgroup/{}/{id}/memory.max",
            p.cgroup_parent
        ))
    })
    .unwrap();
    assert_eq!(mem.trim(), (256u64 << 20).to_string());

    // Filters: by task and by label.
    let only_a = c.list(&ListFilter::default().task("task-a")).await.unwrap();
    assert_eq!(
        only_a.iter().map(|s| s.id.to_string()).collect::<Vec<_>>(),
        vec![id.clone()]
    );
    let by_label = c
        .list(&ListFilter::default().label("team", "rl"))
        .await
        .unwrap();
    assert_eq!(by_label.len(), 1);
    assert_eq!(c.list(&ListFilter::default()).await.unwrap().len(), 2);

    // Pause freezes; any operation resumes transparently.
    assert_eq!(a.pause().await.unwrap().state, SandboxState::Paused);
    let paused = c
        .list(&ListFilter::default().state(SandboxState::Paused))
        .await
        .unwrap();
    assert_eq!(paused.len(), 1);
    let r = a.exec(&argv(["echo", "awake"])).await.unwrap();
    assert_eq!(r.stdout, "awake\n");
    assert_eq!(a.info().await.unwrap().state, SandboxState::Running);
    a.pause().await.unwrap();
    assert_eq!(a.resume().await.unwrap().state, SandboxState::Running);

    // Kill: gone from the API, nothing left on the host.
    a.kill().await.unwrap();
    let err = a.info().await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SandboxNotFound), "{err}");
    b.kill().await.unwrap();
    assert!(c.list(&ListFilter::default()).await.unwrap().is_empty());
    p.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_create_returns_the_same_sandbox() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let req = host();
    let (x, y) = tokio::join!(
        c.create_idempotent(&req, "episode-17"),
        c.create_idempotent(&req, "episode-17")
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.id(), y.id());
    let z = c.create_idempotent(&host(), "episode-17").await.unwrap();
    assert_eq!(z.id(), x.id());
    assert_eq!(c.list(&ListFilter::default()).await.unwrap().len(), 1);
    let other = c.create_idempotent(&host(), "episode-18").await.unwrap();
    assert_ne!(other.id(), x.id());
    // The key survives a restart of the daemon.
    let mut p = p;
    p.restart();
    let again = p
        .client()
        .create_idempotent(&host(), "episode-17")
        .await
        .unwrap();
    assert_eq!(again.id(), x.id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_timeout_kills_the_sandbox() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let sb = c
        .create(&CreateSandbox {
            timeout: Some(1),
            ..host()
        })
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sb.info().await {
            Err(e) if e.code() == Some(ErrorCode::SandboxNotFound) => break,
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sandbox outlived its timeout"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    p.assert_clean();
}

async fn raw(
    p: &Platform,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut rb = p
        .http()
        .request(method.parse().unwrap(), format!("{}{path}", p.url));
    if let Some(k) = key {
        rb = rb.bearer_auth(k);
    }
    if let Some(b) = body {
        rb = rb
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = rb.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_4xx_errors_and_harms_nothing() {
    require_root!();
    let p = Platform::start();
    let key = p.key.clone();
    let k = Some(key.as_str());
    let survivor = p.client().create(&host()).await.unwrap();
    let sid = survivor.id().to_string();

    // (method, path, key, body, expected status, expected code, a word the message must say)
    type Case<'a> = (
        &'a str,
        String,
        Option<&'a str>,
        Option<String>,
        u16,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/sandboxes".into(),
            None,
            Some(json!({"image": "host"}).to_string()),
            401,
            "unauthenticated",
            "API key",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            Some("wrn_wrong"),
            Some(json!({"image": "host"}).to_string()),
            401,
            "unauthenticated",
            "not valid",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "backend": "teleporter"}).to_string()),
            400,
            "invalid_argument",
            "backend",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some("{not json".into()),
            400,
            "invalid_argument",
            "not valid JSON",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "py312"}).to_string()),
            404,
            "image_not_found",
            "warren image ls",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "cpu": -1}).to_string()),
            400,
            "invalid_argument",
            "cpu",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "cpu": 999999}).to_string()),
            400,
            "invalid_argument",
            "cpu",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "memory": "1Ti"}).to_string()),
            400,
            "invalid_argument",
            "memory",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "memory": "lots"}).to_string()),
            400,
            "invalid_argument",
            "not a size",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "timeout": 0}).to_string()),
            400,
            "invalid_argument",
            "timeout",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "pids": 1}).to_string()),
            400,
            "invalid_argument",
            "pids",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "bogus": 1}).to_string()),
            400,
            "invalid_argument",
            "bogus",
        ),
        (
            "POST",
            "/v1/sandboxes".into(),
            k,
            Some(json!({"image": "host", "env": {"A=B": "c"}}).to_string()),
            400,
            "invalid_argument",
            "environment",
        ),
        (
            "GET",
            "/v1/sandboxes/NOT-AN-ID".into(),
            k,
            None,
            400,
            "invalid_argument",
            "not a valid sandbox id",
        ),
        (
            "GET",
            "/v1/sandboxes/zzzzzz0000000000abcd".into(),
            k,
            None,
            404,
            "sandbox_not_found",
            "not part of this cluster",
        ),
        (
            "GET",
            format!("/v1/sandboxes/{}0000000000abcd", &sid[..6]),
            k,
            None,
            404,
            "sandbox_not_found",
            "not found",
        ),
        (
            "POST",
            format!("/v1/sandboxes/{sid}/exec"),
            k,
            Some(json!({}).to_string()),
            400,
            "invalid_argument",
            "nothing to run",
        ),
        (
            "POST",
            format!("/v1/sandboxes/{sid}/exec"),
            k,
            Some(json!({"cmd": "true", "timeout": -3}).to_string()),
            400,
            "invalid_argument",
            "timeout",
        ),
        (
            "GET",
            format!("/v1/sandboxes/{sid}/files?path=/etc/../etc/passwd"),
            k,
            None,
            400,
            "invalid_argument",
            "'..'",
        ),
        (
            "GET",
            format!("/v1/sandboxes/{sid}/files?path=/nope"),
            k,
            None,
            404,
            "file_not_found",
            "/nope",
        ),
        (
            "GET",
            format!("/v1/sandboxes/{sid}/files"),
            k,
            None,
            400,
            "invalid_argument",
            "path",
        ),
        (
            "PUT",
            format!("/v1/sandboxes/{sid}/files?path=/etc/passwd"),
            k,
            Some("x".into()),
            403,
            "permission_denied",
            "/etc/passwd",
        ),
        (
            "POST",
            format!("/v1/sandboxes/{sid}/processes/999/signal"),
            k,
            Some(json!({"signal": "NOPE"}).to_string()),
            400,
            "invalid_argument",
            "not a signal",
        ),
        (
            "GET",
            format!("/v1/sandboxes/{sid}/processes/999"),
            k,
            None,
            404,
            "process_not_found",
            "999",
        ),
        (
            "GET",
            format!("/v1/sandboxes/{sid}/processes/999/output"),
            k,
            None,
            404,
            "process_not_found",
            "999",
        ),
        (
            "POST",
            format!("/v1/sandboxes/{sid}/files/mkdir"),
            k,
            Some(json!({"path": "/tmp", "parents": false}).to_string()),
            409,
            "conflict",
            "/tmp",
        ),
        // Path parameters that do not parse are the same JSON 400, not axum's plain text.
        (
            "GET",
            format!("/v1/sandboxes/{sid}/processes/abc"),
            k,
            None,
            400,
            "invalid_argument",
            "bad path parameter",
        ),
        (
            "POST",
            format!("/v1/sandboxes/{sid}/processes/-1/wait"),
            k,
            None,
            400,
            "invalid_argument",
            "bad path parameter",
        ),
        (
            "GET",
            "/v1/images".into(),
            Some("wrn_wrong"),
            None,
            401,
            "unauthenticated",
            "not valid",
        ),
        (
            "POST",
            "/v1/tasks/t/explode".into(),
            k,
            None,
            404,
            "not_found",
            "pause, resume or stop",
        ),
        (
            "GET",
            "/v1/nowhere".into(),
            k,
            None,
            404,
            "not_found",
            "openapi",
        ),
    ];
    for (method, path, key, body, status, code, needle) in cases {
        let (got, v) = raw(&p, method, &path, key, body.as_deref()).await;
        let msg = v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(
            (got, v["error"]["code"].as_str().unwrap_or_default()),
            (status, code),
            "{method} {path}: {v}"
        );
        assert!(
            msg.contains(needle),
            "{method} {path}: message {msg:?} lacks {needle:?}"
        );
    }

    // A command that does not exist is a result (127), not an error.
    let r = survivor.exec(&argv(["no-such-program"])).await.unwrap();
    assert_eq!(r.status.exit_code, 127);
    assert!(r.stderr.contains("not found"), "{}", r.stderr);
    // The sandbox that was there all along is unharmed.
    assert_eq!(
        survivor.exec(&argv(["echo", "fine"])).await.unwrap().stdout,
        "fine\n"
    );
    let (s, v) = raw(&p, "GET", "/v1/openapi.json", None, None).await;
    assert_eq!(s, 200);
    assert!(v["paths"]["/v1/sandboxes/{id}/exec"].is_object());
}

/// Requests whose bodies are refused before they are read (a bad query, no key) get their 4xx
/// every time: never a 503 "node does not answer" or a reset connection because the server
/// answered while the body was still on its way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_refused_unread_get_their_answer_every_time() {
    require_root!();
    let p = Platform::start();
    let sb = p.client().create(&host()).await.unwrap();
    let sid = sb.id().to_string();
    let big = vec![b'x'; 3 << 20];
    let exec_body =
        json!({"cmd": "true", "argv": ["true"], "stdin": "y".repeat(3 << 20)}).to_string();
    let http = p.http();
    // (what, method, path, key, body, content type, status, code)
    type Case<'a> = (
        &'a str,
        &'a str,
        String,
        Option<&'a str>,
        Vec<u8>,
        &'a str,
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "upload to an empty path",
            "PUT",
            format!("/v1/sandboxes/{sid}/files?path="),
            Some(&p.key),
            big.clone(),
            "application/octet-stream",
            400,
            "invalid_argument",
        ),
        (
            "upload with a bad mode",
            "PUT",
            format!("/v1/sandboxes/{sid}/files?path=/tmp/a&mode=999"),
            Some(&p.key),
            big.clone(),
            "application/octet-stream",
            400,
            "invalid_argument",
        ),
        (
            "tar upload to an empty path",
            "PUT",
            format!("/v1/sandboxes/{sid}/files/tar?path="),
            Some(&p.key),
            big.clone(),
            "application/x-tar",
            400,
            "invalid_argument",
        ),
        (
            "exec with cmd and argv",
            "POST",
            format!("/v1/sandboxes/{sid}/exec"),
            Some(&p.key),
            exec_body.clone().into_bytes(),
            "application/json",
            400,
            "invalid_argument",
        ),
        (
            "upload without a key",
            "PUT",
            format!("/v1/sandboxes/{sid}/files?path=/tmp/b"),
            None,
            big.clone(),
            "application/octet-stream",
            401,
            "unauthenticated",
        ),
    ];
    for (what, method, path, key, body, ctype, status, code) in cases {
        let mut seen = BTreeMap::new();
        for _ in 0..25 {
            let mut rb = http
                .request(method.parse().unwrap(), format!("{}{path}", p.url))
                .header("content-type", ctype)
                .body(body.clone());
            if let Some(k) = key {
                rb = rb.bearer_auth(k);
            }
            let got = match rb.send().await {
                Ok(resp) => {
                    let s = resp.status().as_u16();
                    let v: Value = resp.json().await.unwrap_or(Value::Null);
                    format!(
                        "{s} {}",
                        v["error"]["code"].as_str().unwrap_or("(no JSON error)")
                    )
                }
                Err(e) => format!("transport error: {e}"),
            };
            *seen.entry(got).or_insert(0) += 1;
        }
        let want = format!("{status} {code}");
        assert_eq!(
            seen.keys().collect::<Vec<_>>(),
            vec![&want],
            "{what}: answers {seen:?}"
        );
    }
    assert!(!p.log().contains("ERROR"), "errors logged:\n{}", p.log());
    sb.kill().await.unwrap();
    p.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_with_a_reason_and_429() {
    require_root!();
    let p = Platform::start_with(Some("[node]\nmax_sandboxes = 2\n"));
    let c = p.client();
    c.create(&host()).await.unwrap();
    c.create(&host()).await.unwrap();
    let e = c.create(&host()).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
    assert!(e.to_string().contains("max_sandboxes"), "{e}");
    let (s, v) = raw(
        &p,
        "POST",
        "/v1/sandboxes",
        Some(&p.key),
        Some(r#"{"image":"host"}"#),
    )
    .await;
    assert_eq!(s, 429, "{v}");
    assert!(v["error"]["retry_after_secs"].as_u64().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_measure_cpu_memory_and_disk() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let sb = c
        .create(&CreateSandbox {
            memory: Some(ByteSize(256 << 20)),
            ..host()
        })
        .await
        .unwrap();
    let before = sb.metrics().await.unwrap();
    assert_eq!(before.memory_limit, 256 << 20);
    assert!(before.memory_used > 0, "{before:?}");
    // Half a second of CPU or more in a process that ends (its time is kept by its reaper) —
    // a fixed amount of work, not of time: a best-effort sandbox on a busy host gets little
    // of a wall-clock half second — and 32 MiB held by a process that stays while measured.
    sb.exec(&argv([
        "sh",
        "-c",
        "i=0; while [ $i -lt 800000 ]; do i=$((i+1)); done",
    ]))
    .await
    .unwrap();
    sb.exec(&argv([
        "sh",
        "-c",
        "head -c 33554432 /dev/zero > /tmp/held",
    ]))
    .await
    .unwrap();
    let after = sb.metrics().await.unwrap();
    assert!(
        after.cpu_used_ns >= before.cpu_used_ns + 300_000_000,
        "{before:?} {after:?}"
    );
    assert!(after.cpu_used_pct > 0.0, "{after:?}");
    // /tmp is the sandbox's memory (tmpfs) or its writable layer: either counts.
    let grew_memory = after.memory_used >= before.memory_used + (16 << 20);
    let grew_disk = after.disk_used.unwrap_or(0) >= before.disk_used.unwrap_or(0) + (16 << 20);
    assert!(grew_memory || grew_disk, "{before:?} {after:?}");
    assert!(after.timestamp_ms >= before.timestamp_ms);
    // A sandbox that is not there: 404.
    sb.kill().await.unwrap();
    match sb.metrics().await {
        Err(warren_sdk::Error::Api { status, .. }) => assert_eq!(status, 404),
        other => panic!("{other:?}"),
    }
}
