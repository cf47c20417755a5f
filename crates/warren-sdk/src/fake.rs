//! Tests of whole requests against a canned HTTP reply: what the SDK sends (method, path,
//! headers, body) and how it reads what comes back. A real Warren is tested end to end by the
//! `warren` crate's tests.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use warren_types::api::{CreateSandbox, ExecEvent};
use warren_types::error::ErrorCode;

use crate::{Client, Error};

/// A request as it arrived.
struct Seen {
    head: String,
    body: Vec<u8>,
}

impl Seen {
    fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or_default()
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// Serves one request with `status`, `headers` and `body`; returns the client for it and
/// the request it got.
async fn serve_once(
    status: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    key: Option<&str>,
) -> (Client, JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    )
    .into_bytes();
    for (k, v) in headers {
        reply.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    reply.extend_from_slice(b"\r\n");
    reply.extend_from_slice(body);
    let task = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the client closed before a whole request head");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut seen = Seen {
            head,
            body: buf[head_end..].to_vec(),
        };
        let len: usize = seen
            .header("content-length")
            .map(|v| v.parse().unwrap())
            .unwrap_or(0);
        while seen.body.len() < len {
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the client closed before the whole body");
            seen.body.extend_from_slice(&chunk[..n]);
        }
        conn.write_all(&reply).await.unwrap();
        conn.shutdown().await.unwrap();
        seen
    });
    (Client::new(&url, key).unwrap(), task)
}

const SANDBOX_JSON: &str = r#"{"id":"abcdef0123456789wxyz","node":"abcdef","backend":"container",
"image":"host","labels":{},"state":"running","resources":{"cpu":1000,"memory":536870912,"pids":1024},
"created_at":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T01:00:00Z"}"#;

#[tokio::test]
async fn create_sends_the_key_the_idempotency_key_and_the_body() {
    let (client, seen) = serve_once(
        "201 Created",
        &[("Content-Type", "application/json")],
        SANDBOX_JSON.as_bytes(),
        Some("wk_test"),
    )
    .await;
    let req = CreateSandbox {
        image: "host".into(),
        cpu: Some(500),
        ..Default::default()
    };
    let sb = client.create_idempotent(&req, "rollout-1").await.unwrap();
    assert_eq!(sb.id().as_str(), "abcdef0123456789wxyz");
    assert_eq!(sb.snapshot().unwrap().image, "host");

    let seen = seen.await.unwrap();
    assert_eq!(seen.request_line(), "POST /v1/sandboxes HTTP/1.1");
    assert_eq!(
        seen.header("authorization").as_deref(),
        Some("Bearer wk_test")
    );
    assert_eq!(seen.header("idempotency-key").as_deref(), Some("rollout-1"));
    let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(body, serde_json::json!({"image": "host", "cpu": 500}));
}

#[tokio::test]
async fn a_refusal_without_a_key_says_that_no_key_was_sent() {
    let body = br#"{"error":{"code":"unauthenticated","message":"an API key is required"}}"#;
    let (client, seen) = serve_once("401 Unauthorized", &[], body, None).await;
    let err = client.nodes().await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Unauthenticated));
    let msg = err.to_string();
    assert!(
        msg.starts_with("an API key is required (this client sent no API key"),
        "{msg}"
    );
    let seen = seen.await.unwrap();
    assert_eq!(seen.request_line(), "GET /v1/nodes HTTP/1.1");
    assert_eq!(seen.header("authorization"), None);
}

#[tokio::test]
async fn capacity_refusals_read_retry_after() {
    let body = br#"{"error":{"code":"capacity","message":"every node is full"}}"#;
    let (client, _seen) =
        serve_once("429 Too Many Requests", &[("Retry-After", "4")], body, None).await;
    let err = client.create(&CreateSandbox::default()).await.unwrap_err();
    assert!(err.is_retryable());
    match err {
        Error::Api {
            status,
            retry_after_secs,
            message,
            ..
        } => {
            assert_eq!((status, retry_after_secs), (429, Some(4)));
            assert_eq!(message, "every node is full");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_streaming_exec_asks_for_a_stream_and_reads_its_events() {
    let events = concat!(
        "{\"type\":\"start\",\"process_id\":4,\"pid\":9}\n",
        "{\"type\":\"stdout\",\"data\":\"NDIK\"}\n",
        "{\"type\":\"exit\",\"exit_code\":0,\"stdout_bytes\":3,\"stderr_bytes\":0,\"duration_ms\":1}\n"
    );
    let (client, seen) = serve_once(
        "200 OK",
        &[("Content-Type", "application/x-ndjson")],
        events.as_bytes(),
        None,
    )
    .await;
    let sb = client.sandbox("abcdef0123456789wxyz").unwrap();
    let stream = sb
        .exec_stream(&crate::argv(["python3", "-c", "print(6*7)"]))
        .await
        .unwrap();
    let got: Vec<ExecEvent> = futures_util::StreamExt::collect::<Vec<_>>(stream)
        .await
        .into_iter()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(got.len(), 3);
    assert_eq!(
        got[1],
        ExecEvent::Stdout {
            data: "NDIK".into()
        }
    );

    let seen = seen.await.unwrap();
    assert_eq!(
        seen.request_line(),
        "POST /v1/sandboxes/abcdef0123456789wxyz/exec HTTP/1.1"
    );
    let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"argv": ["python3", "-c", "print(6*7)"], "stream": true})
    );
}

#[tokio::test]
async fn uploads_send_raw_bytes_with_their_length_and_mode() {
    let entry = r#"{"name":"run.sh","path":"/home/user/run.sh","kind":"file","size":5,
"mode":493,"uid":1000,"gid":1000,"modified":0}"#;
    let (client, seen) = serve_once("200 OK", &[], entry.as_bytes(), None).await;
    let local = std::env::temp_dir().join(format!("warren-sdk-upload-{}", std::process::id()));
    std::fs::write(&local, b"hello").unwrap();
    let sb = client.sandbox("abcdef0123456789wxyz").unwrap();
    let got = sb.upload_file(&local, "run.sh", Some(0o755)).await.unwrap();
    std::fs::remove_file(&local).unwrap();
    assert_eq!(got.mode, 0o755);

    let seen = seen.await.unwrap();
    assert_eq!(
        seen.request_line(),
        "PUT /v1/sandboxes/abcdef0123456789wxyz/files?path=run.sh&mode=755 HTTP/1.1"
    );
    assert_eq!(seen.header("content-length").as_deref(), Some("5"));
    assert_eq!(
        seen.header("content-type").as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(seen.body, b"hello");
}

#[tokio::test]
async fn downloads_report_size_and_mode_and_stream_the_bytes() {
    let (client, seen) = serve_once(
        "200 OK",
        &[("x-warren-file-size", "3"), ("x-warren-file-mode", "640")],
        b"abc",
        None,
    )
    .await;
    let sb = client
        .sandbox("abcdef0123456789wxyz")
        .unwrap()
        .as_user("root");
    let stream = sb.read_file_stream("/etc/x").await.unwrap();
    assert_eq!((stream.size(), stream.mode()), (Some(3), Some(0o640)));
    let chunks: Vec<_> = futures_util::StreamExt::collect::<Vec<_>>(stream).await;
    let bytes: Vec<u8> = chunks.into_iter().flat_map(|c| c.unwrap()).collect();
    assert_eq!(bytes, b"abc");
    let seen = seen.await.unwrap();
    assert_eq!(
        seen.request_line(),
        "GET /v1/sandboxes/abcdef0123456789wxyz/files?path=%2Fetc%2Fx&user=root HTTP/1.1"
    );
}

#[tokio::test]
async fn lists_name_the_nodes_that_did_not_answer() {
    let body = format!(
        r#"{{"sandboxes":[{SANDBOX_JSON}],"unreachable":[{{"node":"nodebb",
        "error":{{"code":"unavailable","message":"node nodebb (http://10.0.0.2:7701) does not answer"}}}}]}}"#
    );
    let (client, seen) = serve_once("200 OK", &[], body.as_bytes(), None).await;
    let list = client
        .list(&crate::ListFilter::default().task("t"))
        .await
        .unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].id.as_str(), "abcdef0123456789wxyz");
    assert!(!list.is_complete());
    assert_eq!(list.unreachable[0].node.as_str(), "nodebb");
    assert_eq!(list.unreachable[0].error.code, ErrorCode::Unavailable);
    assert_eq!(
        seen.await.unwrap().request_line(),
        "GET /v1/sandboxes?task=t HTTP/1.1"
    );

    // An answer from every node (or from a Warren that predates `unreachable`) is complete.
    let body = br#"{"task":"t","action":"stop","succeeded":3,"failed":[]}"#;
    let (client, _seen) = serve_once("200 OK", &[], body, None).await;
    let r = client
        .task_action("t", crate::TaskAction::Stop)
        .await
        .unwrap();
    assert_eq!(r.succeeded, 3);
    assert!(r.is_complete());
}
