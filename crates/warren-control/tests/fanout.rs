//! The control plane's multi-node calls against nodes that answer, fail, hang or are gone:
//! each answer says which nodes did not reply, and the all-or-fail call refuses. No root
//! needed: the nodes are small HTTP servers on unix sockets that speak the node API's JSON.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};
use warren_control::{Control, ControlConfig, Endpoint};

/// How a fake node behaves once registered (it always says who it is).
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    /// Answers like a node with one sandbox of task `t`.
    Good,
    /// Answers every call but `/v1/node` with a 500 and a Warren error body.
    Failing,
    /// Never answers any call but `/v1/node`.
    Hanging,
}

fn node_info(id: &str) -> Value {
    json!({
        "id": id, "version": "test", "sandboxes": 1, "max_sandboxes": 0,
        "memory_reserved": 0, "memory_allocatable": 0, "memory_available": 0,
        "threads": 1, "pid_max": 4096, "cgroups": "v1", "max_upload": 1024,
    })
}

fn sandbox(node: &str) -> Value {
    json!({
        "id": format!("{node}0123456789abcd"), "node": node, "backend": "container",
        "image": "host", "task": "t", "labels": {}, "state": "running",
        "resources": {"cpu": 1000, "memory": 1 << 29, "pids": 64},
        "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-01T01:00:00Z",
    })
}

fn fake_node(id: &'static str, b: Behaviour) -> Router {
    let answer = move |good: Value| async move {
        match b {
            Behaviour::Good => (StatusCode::OK, axum::Json(good)).into_response(),
            Behaviour::Failing => (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(
                    json!({"error": {"code": "internal", "message": "the disk is on fire"}}),
                ),
            )
                .into_response(),
            Behaviour::Hanging => {
                std::future::pending::<()>().await;
                unreachable!()
            }
        }
    };
    Router::new()
        .route("/v1/node", get(move || async move { axum::Json(node_info(id)) }))
        .route(
            "/v1/sandboxes",
            get(move |Query(q): Query<Vec<(String, String)>>| async move {
                // A node refuses a filter it cannot read: the caller's error.
                if q.iter().any(|(k, v)| k == "label" && v == "bad") {
                    return (
                        StatusCode::BAD_REQUEST,
                        axum::Json(json!({"error": {"code": "invalid_argument", "message": "label filter \"bad\" is not key=value"}})),
                    )
                        .into_response();
                }
                answer(json!({"sandboxes": [sandbox(id)]})).await
            }),
        )
        .route(
            "/v1/tasks",
            get(move || answer(json!({"tasks": [{"name": "t", "sandboxes": 1, "running": 1, "paused": 0}]}))),
        )
        .route(
            "/v1/tasks/{task}/{action}",
            post(move || answer(json!({"task": "t", "action": "pause", "succeeded": 1, "failed": []}))),
        )
        .route("/v1/events", get(move || answer(json!({"events": []}))))
        .route(
            "/v1/images/stats",
            get(move || answer(json!({"layers": [], "sandboxes": []}))),
        )
}

/// A fake node serving on a unix socket until it is stopped.
struct FakeNode {
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeNode {
    fn start(dir: &Path, id: &'static str, b: Behaviour) -> FakeNode {
        let socket = dir.join(format!("{id}.sock"));
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let app = fake_node(id, b);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            // Stopping also closes the connections the control plane keeps open to it.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        FakeNode {
            socket,
            stop: Some(tx),
        }
    }

    /// Stops answering: nothing listens on its socket any more.
    fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A control plane over `nodes`, served on a loopback port; its URL and admin key.
struct Plane {
    url: String,
    key: String,
    http: reqwest::Client,
    _server: tokio::task::JoinHandle<()>,
    nodes: Vec<FakeNode>,
    _dir: tempfile::TempDir,
}

impl Plane {
    async fn start(kinds: &[(&'static str, Behaviour)]) -> Plane {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<FakeNode> = kinds
            .iter()
            .map(|(id, b)| FakeNode::start(dir.path(), id, *b))
            .collect();
        let cfg = ControlConfig {
            data_dir: dir.path().join("data"),
            collect_interval_ms: 3_600_000,
            // The healthy fake nodes share the test's runtime: a loaded machine must not make
            // them late. Only the hanging node waits this long.
            node_timeout_ms: 1500,
            node_task_timeout_ms: 1500,
            ..ControlConfig::default()
        };
        std::fs::create_dir_all(&cfg.data_dir).unwrap();
        let endpoints: Vec<Endpoint> = nodes
            .iter()
            .map(|n| Endpoint::Unix(n.socket.clone()))
            .collect();
        let started = Control::start(cfg, &endpoints).await.unwrap();
        let key = started.new_admin_key.unwrap();
        let app = warren_control::api::router(Arc::clone(&started.control));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Plane {
            url,
            key,
            http: reqwest::Client::new(),
            _server: server,
            nodes,
            _dir: dir,
        }
    }

    /// Stops node `i`, and waits until nothing answers on its socket.
    async fn stop_node(&mut self, i: usize) {
        self.nodes[i].stop();
        while tokio::net::UnixStream::connect(&self.nodes[i].socket)
            .await
            .is_ok()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str) -> (u16, Value) {
        let resp = tokio::time::timeout(
            Duration::from_secs(20),
            self.http
                .request(method, format!("{}{path}", self.url))
                .bearer_auth(&self.key)
                .send(),
        )
        .await
        .expect("the control plane must answer even when nodes hang")
        .unwrap();
        let status = resp.status().as_u16();
        let body = resp.bytes().await.unwrap();
        let v = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap()
        };
        (status, v)
    }
}

/// The node ids named in an answer's `unreachable`, sorted.
fn named(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = v["unreachable"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|f| f["node"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gathered_answer_names_the_nodes_that_did_not_reply() {
    let mut p = Plane::start(&[
        ("goodaa", Behaviour::Good),
        ("failbb", Behaviour::Failing),
        ("hangcc", Behaviour::Hanging),
        ("gonedd", Behaviour::Good),
    ])
    .await;
    p.stop_node(3).await;
    let missing = ["failbb", "gonedd", "hangcc"];

    let (status, v) = p.call(reqwest::Method::GET, "/v1/sandboxes").await;
    assert_eq!(status, 200, "{v}");
    let ids: Vec<&str> = v["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["node"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["goodaa"]);
    assert_eq!(named(&v), missing, "{v}");
    // Each says why: the failing node's own error, the others as not answering.
    for f in v["unreachable"].as_array().unwrap() {
        let (code, msg) = (
            f["error"]["code"].as_str().unwrap(),
            f["error"]["message"].as_str().unwrap(),
        );
        match f["node"].as_str().unwrap() {
            "failbb" => assert_eq!((code, msg), ("internal", "the disk is on fire")),
            "hangcc" => {
                assert_eq!(code, "unavailable");
                assert!(
                    msg.contains("hangcc")
                        && msg.contains("no answer to /v1/sandboxes within 1.5 s"),
                    "{msg}"
                );
            }
            "gonedd" => assert_eq!(code, "unavailable", "{msg}"),
            other => panic!("unexpected node {other}"),
        }
    }

    let (status, v) = p.call(reqwest::Method::GET, "/v1/tasks").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tasks"][0]["sandboxes"], 1, "{v}");
    assert_eq!(named(&v), missing, "{v}");

    let (status, v) = p.call(reqwest::Method::POST, "/v1/tasks/t/pause").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["succeeded"], 1, "{v}");
    assert_eq!(named(&v), missing, "{v}");

    let (status, v) = p
        .call(reqwest::Method::GET, "/v1/events?kind=seccomp")
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(named(&v), missing, "{v}");

    let (status, v) = p.call(reqwest::Method::GET, "/v1/images/stats").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(named(&v), missing, "{v}");

    // Every known node is listed; the one that is gone is named (the hanging and failing
    // ones still say who they are).
    let (status, v) = p.call(reqwest::Method::GET, "/v1/nodes").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["nodes"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(named(&v), ["gonedd"], "{v}");

    // Removing a layer needs every node's sandboxes: refused, naming the missing nodes. (An
    // image name is looked up first: one that does not exist is a 404 before any node is
    // asked.)
    let (status, v) = p
        .call(reqwest::Method::DELETE, "/v1/images/some/image:1")
        .await;
    assert_eq!(status, 404, "{v}");
    let layer = format!("/v1/images/sha256:{}", "0".repeat(64));
    let (status, v) = p.call(reqwest::Method::DELETE, &layer).await;
    assert_eq!(status, 503, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    for n in missing {
        assert!(msg.contains(&format!("node {n}")), "{msg}");
    }
    assert!(msg.contains("3 of 4 did not answer"), "{msg}");

    // A filter a node refuses is the caller's error, not a missing node.
    let (status, v) = p
        .call(reqwest::Method::GET, "/v1/sandboxes?label=bad")
        .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_argument");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_no_node_answers_the_call_fails_and_names_them() {
    let p = Plane::start(&[
        ("failbb", Behaviour::Failing),
        ("hangcc", Behaviour::Hanging),
    ])
    .await;
    for (method, path) in [
        (reqwest::Method::GET, "/v1/sandboxes"),
        (reqwest::Method::GET, "/v1/tasks"),
        (reqwest::Method::POST, "/v1/tasks/t/stop"),
        (reqwest::Method::GET, "/v1/events"),
        (reqwest::Method::GET, "/v1/images/stats"),
    ] {
        let (status, v) = p.call(method, path).await;
        assert_eq!(status, 503, "{path}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("no node answered")
                && msg.contains("node failbb")
                && msg.contains("node hangcc"),
            "{path}: {msg}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_answering_gives_a_complete_answer() {
    let p = Plane::start(&[("goodaa", Behaviour::Good), ("goodbb", Behaviour::Good)]).await;
    let (status, v) = p.call(reqwest::Method::GET, "/v1/sandboxes").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["sandboxes"].as_array().unwrap().len(), 2, "{v}");
    // `unreachable` is left out when every node answered: old clients see the old shape.
    assert!(v.get("unreachable").is_none(), "{v}");
    let (_, v) = p.call(reqwest::Method::GET, "/v1/tasks").await;
    assert_eq!(v["tasks"][0]["sandboxes"], 2, "{v}");
    let (_, v) = p.call(reqwest::Method::POST, "/v1/tasks/t/pause").await;
    assert_eq!(v["succeeded"], 2, "{v}");
    assert!(v.get("unreachable").is_none(), "{v}");
}
