//! The gateway's refusals, before any call to Warren: keys, routing headers, bodies, ids; and
//! Warren unreachable (a 503 that says so, never a 500 or a panic). Driven through the router
//! itself; the SDK-driven tests (`sdk/e2b/`) run the real `e2b` package against `warren up`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use crate::{Gateway, keys, router};

/// A gateway whose Warren does not answer (nothing listens on port 9 of loopback).
fn gateway() -> (axum::Router, String) {
    let key = keys::new_key();
    let gw = Gateway {
        warren: warren_sdk::Client::new("http://127.0.0.1:9", Some("wk_unused")).unwrap(),
        key: key.clone(),
        base_image: "host".into(),
        domain: None,
        caller: None,
        tokens: Arc::new(crate::tokens::Tokens::new(keys::TokenKey::new(
            b"test", &key,
        ))),
    };
    (router(Arc::new(gw)), key)
}

/// An envd access token of the gateway `gateway()` makes, for key `key_test`, valid an hour.
fn token(key: &str, sandbox: &str) -> String {
    keys::TokenKey::new(b"test", key).issue("key_test", sandbox, crate::tokens::now() + 3600)
}

async fn call(app: &axum::Router, req: Request<Body>) -> (StatusCode, serde_json::Value) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let json = if body.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&body)))
    };
    (status, json)
}

fn post(path: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::post(path).header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("x-api-key", k);
    }
    b.body(Body::from(body.to_string())).unwrap()
}

#[tokio::test]
async fn keys_are_required_and_checked() {
    let (app, _) = gateway();
    let (s, j) = call(&app, post("/v2/sandboxes", None, "{}")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(j["code"], 401);
    assert!(j["message"].as_str().unwrap().contains("X-API-KEY"), "{j}");
    // A key that is not the gateway's goes to Warren to be checked (it may be one made with
    // `warren key create --form e2b`); with Warren unreachable the gateway cannot tell, and says
    // so with a 503, never a 401 that would blame a key that may be good. A key Warren does not
    // know gets 401 in `sdk/e2b/tests/test_iam.py`, against a real Warren.
    let (s, j) = call(&app, post("/v2/sandboxes", Some(&keys::new_key()), "{}")).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{j}");
    assert!(j["message"].as_str().unwrap().contains("Warren"), "{j}");
    // Every control-plane route checks it.
    for (m, p) in [
        ("GET", "/v2/sandboxes"),
        ("GET", "/sandboxes"),
        ("GET", "/sandboxes/abc"),
        ("DELETE", "/sandboxes/abc"),
        ("POST", "/sandboxes/abc/timeout"),
        ("POST", "/sandboxes/abc/pause"),
        ("POST", "/sandboxes/abc/connect"),
        ("POST", "/v2/sandboxes/abc/connect"),
        ("POST", "/sandboxes/abc/resume"),
    ] {
        let req = Request::builder()
            .method(m)
            .uri(p)
            .body(Body::empty())
            .unwrap();
        assert_eq!(call(&app, req).await.0, StatusCode::UNAUTHORIZED, "{m} {p}");
    }
}

#[tokio::test]
async fn bad_bodies_and_parameters_are_4xx_with_a_reason() {
    let (app, key) = gateway();
    let k = Some(key.as_str());
    for (body, words) in [
        ("{", "must be a NewSandbox"),
        (r#"{"templateID": 5}"#, "must be a NewSandbox"),
        (r#"{"timeout": -1}"#, "must be a NewSandbox"),
        (r#"{"autoPause": true}"#, "autoPause"),
        (
            r#"{"network": {"egressProxy": {"address": "x"}}}"#,
            "egressProxy",
        ),
        (
            r#"{"network": {"denyOut": ["example.com"]}}"#,
            "not an IP address",
        ),
    ] {
        let (s, j) = call(&app, post("/v2/sandboxes", k, body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {j}");
        assert!(
            j["message"].as_str().unwrap().contains(words),
            "{body}: {j}"
        );
    }
    let put = |body: &str| {
        Request::put("/sandboxes/abc/network")
            .header("x-api-key", &key)
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (s, j) = call(&app, put(r#"{"denyOut": ["x.test"]}"#)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
    let (s, _) = call(&app, put("{")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Snapshots: memory cannot be kept; only snapshots are deleted here.
    let (s, j) = call(
        &app,
        post("/sandboxes/abc/snapshots", k, r#"{"memory": true}"#),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(j["message"].as_str().unwrap().contains("memory"), "{j}");
    let req = Request::delete("/templates/base")
        .header("x-api-key", &key)
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&app, req).await.0, StatusCode::NOT_FOUND);
    let (s, j) = call(&app, post("/sandboxes/abc/timeout", k, r#"{"t": 1}"#)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
    let (s, _) = call(
        &app,
        post("/v2/sandboxes/abc/connect", k, r#"{"timeout": 0}"#),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    for q in [
        "state=gone",
        "limit=0",
        "limit=101",
        "order=up",
        "nextToken=x",
        "metadata=a",
        "metadata=a%3",
        "startedAfter=2026-01-01T00:00:00Z",
    ] {
        let req = Request::get(format!("/v2/sandboxes?{q}"))
            .header("x-api-key", &key)
            .body(Body::empty())
            .unwrap();
        let (s, j) = call(&app, req).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {j}");
    }
    // An id that cannot be Warren's is not found, without asking Warren.
    let req = Request::get("/sandboxes/no-such.id")
        .header("x-api-key", &key)
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&app, req).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn warren_unreachable_is_a_503_that_says_so() {
    let (app, key) = gateway();
    let (s, j) = call(&app, post("/v2/sandboxes", Some(&key), "{}")).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{j}");
    assert!(
        j["message"].as_str().unwrap().contains("could not connect"),
        "{j}"
    );
}

#[tokio::test]
async fn data_plane_routing_headers() {
    let (app, _) = gateway();
    let health = |id: Option<&str>, port: Option<&str>| {
        let mut b = Request::get("/health");
        if let Some(i) = id {
            b = b.header("e2b-sandbox-id", i);
        }
        if let Some(p) = port {
            b = b.header("e2b-sandbox-port", p);
        }
        b.body(Body::empty()).unwrap()
    };
    // No headers: the gateway's own health.
    assert_eq!(
        call(&app, health(None, None)).await.0,
        StatusCode::NO_CONTENT
    );
    // Half the pair: named.
    let (s, j) = call(&app, health(Some("abc"), None)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(j["message"], "Missing header: E2b-Sandbox-Port");
    let (s, j) = call(&app, health(None, Some("49983"))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(j["message"], "Missing header: E2b-Sandbox-Id");
    let (s, j) = call(&app, health(Some("abc"), Some("port"))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
    // An id that cannot exist: E2B's words, which the SDK reads as "not running".
    let (s, j) = call(&app, health(Some("../x"), Some("49983"))).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert!(
        j["message"].as_str().unwrap().contains("was not found"),
        "{j}"
    );
    // Another port: not open (only envd's is served).
    let (s, j) = call(&app, health(Some("abc"), Some("8080"))).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert!(
        j["message"].as_str().unwrap().contains("port is not open"),
        "{j}"
    );
    // Warren unreachable: 503, not "not found" (the sandbox may well be running).
    let (s, _) = call(&app, health(Some("abc"), Some("49983"))).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
}

/// A data-plane call: routing headers, the token, a body.
fn envd_call(path: &str, token: Option<&str>, ctype: &str, body: Vec<u8>) -> Request<Body> {
    let mut b = Request::post(path)
        .header("e2b-sandbox-id", "abcdef0123456789wxyz")
        .header("e2b-sandbox-port", "49983")
        .header("content-type", ctype);
    if let Some(t) = token {
        b = b.header("x-access-token", t);
    }
    b.body(Body::from(body)).unwrap()
}

/// The envelopes of a streaming answer.
async fn stream_answer(app: &axum::Router, req: Request<Body>) -> Vec<(u8, serde_json::Value)> {
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "streams answer 200, errors at the end"
    );
    assert_eq!(resp.headers()["content-type"], crate::connect::STREAM_JSON);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut rest = &body[..];
    while !rest.is_empty() {
        let (flags, payload, r) = crate::connect::split_envelope(rest, 1 << 20).unwrap();
        out.push((flags, serde_json::from_slice(payload).unwrap()));
        rest = r;
    }
    out
}

#[tokio::test]
async fn data_plane_calls_need_the_sandboxs_token_and_whole_envelopes() {
    let (app, key) = gateway();
    let good = token(&key, "abcdef0123456789wxyz");
    let start = crate::connect::envelope(0, br#"{"process":{"cmd":"true"}}"#).to_vec();
    // Streaming: the error is the end-of-stream message.
    for token in [None, Some("nope"), Some(token(&key, "other").as_str())] {
        let ev = stream_answer(
            &app,
            envd_call(
                "/process.Process/Start",
                token,
                crate::connect::STREAM_JSON,
                start.clone(),
            ),
        )
        .await;
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].0, crate::connect::FLAG_END_STREAM);
        assert_eq!(ev[0].1["error"]["code"], "unauthenticated", "{token:?}");
    }
    // Unary: the error's status and body.
    let (s, j) = call(
        &app,
        envd_call(
            "/process.Process/List",
            None,
            "application/json",
            b"{}".to_vec(),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(j["code"], "unauthenticated");
    // With the token: a malformed or oversized envelope is refused before anything runs.
    for (body, code) in [
        (b"\x00\x00\x00".to_vec(), "invalid_argument"),
        (b"\x00\x7f\xff\xff\xff".to_vec(), "resource_exhausted"),
        (b"\x01\x00\x00\x00\x02{}".to_vec(), "unimplemented"),
        (
            crate::connect::envelope(0, b"{}").to_vec(),
            "invalid_argument",
        ),
        (
            crate::connect::envelope(
                0,
                br#"{"process":{"cmd":"sh"},"pty":{"size":{"cols":0,"rows":24}}}"#,
            )
            .to_vec(),
            "invalid_argument",
        ),
        (
            crate::connect::envelope(
                0,
                br#"{"process":{"cmd":"sh"},"pty":{"size":{"cols":70000,"rows":24}}}"#,
            )
            .to_vec(),
            "invalid_argument",
        ),
        (
            crate::connect::envelope(0, br#"{"process":{"cmd":"sh"},"tag":"t"}"#).to_vec(),
            "unimplemented",
        ),
    ] {
        let ev = stream_answer(
            &app,
            envd_call(
                "/process.Process/Start",
                Some(&good),
                crate::connect::STREAM_JSON,
                body.clone(),
            ),
        )
        .await;
        assert_eq!(ev.last().unwrap().1["error"]["code"], code, "{body:?}");
    }
    // Unknown methods, and the ones not served yet, say so.
    let (s, j) = call(
        &app,
        envd_call(
            "/process.Process/Nope",
            Some(&good),
            "application/json",
            b"{}".to_vec(),
        ),
    )
    .await;
    assert_eq!(
        (s, j["code"].as_str()),
        (StatusCode::NOT_IMPLEMENTED, Some("unimplemented"))
    );
    // Input, closing and resizing: malformed messages are refused before Warren is asked.
    for (method, body, want) in [
        ("SendInput", &b"{}"[..], "missing field `process`"),
        (
            "SendInput",
            br#"{"process":{"pid":1},"input":{"stdin":"!!"}}"#,
            "not base64",
        ),
        (
            "SendInput",
            br#"{"process":{"pid":1},"input":{"stdin":"","pty":""}}"#,
            "give one",
        ),
        ("CloseStdin", b"[]", "the request message"),
        (
            "Update",
            br#"{"process":{"pid":1},"pty":{"size":{"cols":0,"rows":0}}}"#,
            "each must be 1 to",
        ),
    ] {
        let (s, j) = call(
            &app,
            envd_call(
                &format!("/process.Process/{method}"),
                Some(&good),
                "application/json",
                body.to_vec(),
            ),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{method} {j}");
        assert!(
            j["message"].as_str().unwrap().contains(want),
            "{method} {j}"
        );
    }
    // A client stream of input: it must start by naming the process, and its envelopes are
    // whole and bounded, however the body arrives.
    let data = crate::connect::envelope(0, br#"{"data":{"input":{"stdin":"aGk="}}}"#);
    let start_msg = crate::connect::envelope(0, br#"{"start":{"process":{"pid":1}}}"#);
    let mut two_starts = start_msg.to_vec();
    two_starts.extend_from_slice(&start_msg);
    for (body, code, want) in [
        (
            data.to_vec(),
            "invalid_argument",
            "before the stream's start",
        ),
        (Vec::new(), "invalid_argument", "without its start"),
        (
            crate::connect::envelope(0, br#"{"other":{}}"#).to_vec(),
            "invalid_argument",
            "start, data or keepalive",
        ),
        (
            b"\x00\x00\x00\x00\x09{}".to_vec(),
            "invalid_argument",
            "inside an envelope",
        ),
        (
            b"\x00\x7f\xff\xff\xff".to_vec(),
            "resource_exhausted",
            "over the limit",
        ),
        // The first start asks Warren, which is not there.
        (two_starts, "unavailable", ""),
    ] {
        let ev = stream_answer(
            &app,
            envd_call(
                "/process.Process/StreamInput",
                Some(&good),
                crate::connect::STREAM_JSON,
                body.clone(),
            ),
        )
        .await;
        let err = &ev.last().unwrap().1["error"];
        assert_eq!(err["code"], code, "{body:?}: {err}");
        assert!(err["message"].as_str().unwrap().contains(want), "{err}");
    }
    // Another port, or an id no sandbox can have: E2B's proxy answers, before the token.
    let mut req = envd_call(
        "/process.Process/List",
        None,
        "application/json",
        b"{}".to_vec(),
    );
    req.headers_mut()
        .insert("e2b-sandbox-port", "8080".parse().unwrap());
    let (s, j) = call(&app, req).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert!(
        j["message"].as_str().unwrap().contains("port is not open"),
        "{j}"
    );
    let mut req = envd_call(
        "/process.Process/List",
        None,
        "application/json",
        b"{}".to_vec(),
    );
    req.headers_mut()
        .insert("e2b-sandbox-id", "NOT-an-id".parse().unwrap());
    let (s, j) = call(&app, req).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY);
    assert!(
        j["message"].as_str().unwrap().contains("was not found"),
        "{j}"
    );
    // Warren unreachable: unavailable, in the stream.
    let ev = stream_answer(
        &app,
        envd_call(
            "/process.Process/Start",
            Some(&good),
            crate::connect::STREAM_JSON,
            start,
        ),
    )
    .await;
    assert_eq!(ev.last().unwrap().1["error"]["code"], "unavailable");
}

#[tokio::test]
async fn file_routes_refuse_what_they_cannot_serve() {
    let (app, key) = gateway();
    let good = token(&key, "abcdef0123456789wxyz");
    let get = |uri: &str, token: Option<&str>| {
        let mut b = Request::get(uri)
            .header("e2b-sandbox-id", "abcdef0123456789wxyz")
            .header("e2b-sandbox-port", "49983");
        if let Some(t) = token {
            b = b.header("x-access-token", t);
        }
        b.body(Body::empty()).unwrap()
    };
    let (s, j) = call(&app, get("/files?path=/a", None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{j}");
    let (s, j) = call(&app, get("/files?path=/a&signature=v1_abc", None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(
        j["message"]
            .as_str()
            .unwrap()
            .contains("not a v1 signature"),
        "{j}"
    );
    let forged = format!("v1_{}", "A".repeat(43));
    let (s, j) = call(
        &app,
        get(&format!("/files?path=/a&signature={forged}"), None),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(
        j["message"].as_str().unwrap().contains("does not match"),
        "{j}"
    );
    let (s, j) = call(
        &app,
        get(
            &format!("/files?path=/a&username=a:b&signature={forged}"),
            None,
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(j["message"].as_str().unwrap().contains("':'"), "{j}");
    // The right signature for another path, user or operation does not match either; an
    // expired one is refused before any is computed. (The token is `good` itself: one issued
    // again now may carry a later expiry, a second boundary later, and be another token.)
    let token = good.clone();
    // As the SDK writes it in a URL (urllib's quote): base64's + and / escaped.
    let enc = |s: String| s.replace('+', "%2B").replace('/', "%2F");
    let sig = enc(keys::file_signature("/a", "read", "", &token, None));
    for uri in [
        format!("/files?path=/b&signature={sig}"),
        format!("/files?path=/a&username=root&signature={sig}"),
        format!("/files?path=/a&signature={sig}&signature_expiration=99999999999"),
    ] {
        let (s, j) = call(&app, get(&uri, None)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri} {j}");
    }
    let old = enc(keys::file_signature("/a", "read", "", &token, Some(1)));
    let (s, j) = call(
        &app,
        get(
            &format!("/files?path=/a&signature={old}&signature_expiration=1"),
            None,
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(j["message"].as_str().unwrap().contains("expired"), "{j}");
    // The right one, of a token the gateway has not seen (answered before a restart): the
    // gateway cannot tell it from a forgery.
    let (s, j) = call(&app, get(&format!("/files?path=/a&signature={sig}"), None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{j}");
    assert!(j["message"].as_str().unwrap().contains("connect"), "{j}");
    // Once the token is used, it is known: the URL gets through to Warren (unreachable here:
    // a 503).
    let (s, j) = call(&app, get("/files", Some(&good))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(j["message"].as_str().unwrap().contains("?path="), "{j}");
    let (s, j) = call(&app, get(&format!("/files?path=/a&signature={sig}"), None)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{j}");
    // Warren unreachable: a 503 that says so.
    let (s, _) = call(&app, get("/files?path=/a", Some(&good))).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    // A multipart body with no part, and one whose part names no destination.
    let form = |body: &str| {
        Request::post("/files")
            .header("e2b-sandbox-id", "abcdef0123456789wxyz")
            .header("e2b-sandbox-port", "49983")
            .header("x-access-token", &good)
            .header("content-type", "multipart/form-data; boundary=XX")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (s, j) = call(&app, form("--XX--\r\n")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
    let (s, j) = call(
        &app,
        form("--XX\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nhi\r\n--XX--\r\n"),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        j["message"].as_str().unwrap().contains("no destination"),
        "{j}"
    );
    // Raw uploads: one file, named by ?path=; the types and encodings it cannot read are 415s.
    let raw = |uri: &str, ctype: &str, encoding: Option<&str>| {
        let mut b = Request::post(uri)
            .header("e2b-sandbox-id", "abcdef0123456789wxyz")
            .header("e2b-sandbox-port", "49983")
            .header("x-access-token", &good)
            .header("content-type", ctype);
        if let Some(e) = encoding {
            b = b.header("content-encoding", e);
        }
        b.body(Body::from("data")).unwrap()
    };
    for (uri, ctype, enc, status, want) in [
        (
            "/files",
            "application/octet-stream",
            None,
            StatusCode::BAD_REQUEST,
            "?path=",
        ),
        (
            "/files?path=/a",
            "text/plain",
            None,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type",
        ),
        (
            "/files?path=/a",
            "application/octet-stream",
            Some("br"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "gzip or none",
        ),
        (
            "/files?path=/a",
            "multipart/form-data; boundary=XX",
            Some("gzip"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "not multipart",
        ),
    ] {
        let (s, j) = call(&app, raw(uri, ctype, enc)).await;
        assert_eq!(s, status, "{uri} {ctype} {j}");
        assert!(j["message"].as_str().unwrap().contains(want), "{j}");
    }
    // A gzip body that is not gzip: the decoder's error, as a 400, not Warren's.
    let (s, j) = call(
        &app,
        raw("/files?path=/a", "application/octet-stream", Some("gzip")),
    )
    .await;
    assert!(
        s == StatusCode::BAD_REQUEST || s == StatusCode::SERVICE_UNAVAILABLE,
        "{s} {j}"
    );
    // Watches: what the gateway cannot serve is refused in the stream before Warren is asked
    // (Warren is not there: asking it is `unavailable`).
    for (body, code) in [
        (&br#"{"recursive":true}"#[..], "invalid_argument"),
        (br#"{"path":"/"}"#, "unavailable"),
    ] {
        let ev = stream_answer(
            &app,
            envd_call(
                "/filesystem.Filesystem/WatchDir",
                Some(&good),
                crate::connect::STREAM_JSON,
                crate::connect::envelope(0, body).to_vec(),
            ),
        )
        .await;
        assert_eq!(ev.last().unwrap().1["error"]["code"], code, "{body:?}");
    }
    let (s, j) = call(
        &app,
        envd_call(
            "/filesystem.Filesystem/GetWatcherEvents",
            Some(&good),
            "application/json",
            br#"{"watcherId":"not-a-number"}"#.to_vec(),
        ),
    )
    .await;
    assert_eq!(
        (s, j["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (s, j) = call(
        &app,
        envd_call(
            "/filesystem.Filesystem/Stat",
            Some(&good),
            "application/json",
            b"{\"path\": 5}".to_vec(),
        ),
    )
    .await;
    assert_eq!(
        (s, j["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_argument"))
    );
}

/// A signed URL costs no call to Warren and no work per sandbox: without the sandbox named it
/// is refused at once (it used to make the gateway list every sandbox of every node with the
/// admin key and hash once per sandbox); named, it is checked against that sandbox's few
/// recent tokens only. Warren is unreachable here: any call to it would be a 503.
#[tokio::test]
async fn signed_urls_name_their_sandbox_and_ask_warren_nothing() {
    let (app, key) = gateway();
    let enc = |s: String| s.replace('+', "%2B").replace('/', "%2F");
    let good = token(&key, "abcdef0123456789wxyz");
    let sig = enc(keys::file_signature("/a", "read", "", &good, None));
    let uri = format!("/files?path=/a&signature={sig}");
    let (s, j) = call(&app, Request::get(&uri).body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
    assert!(
        j["message"].as_str().unwrap().contains("E2b-Sandbox-Id"),
        "{j}"
    );
    // Known to the gateway (used once), under another sandbox's name it matches nothing; a
    // forged signature neither.
    let named = |id: &str, uri: &str, token: Option<&str>| {
        let mut b = Request::get(uri)
            .header("e2b-sandbox-id", id)
            .header("e2b-sandbox-port", "49983");
        if let Some(t) = token {
            b = b.header("x-access-token", t);
        }
        b.body(Body::empty()).unwrap()
    };
    let (s, _) = call(&app, named("abcdef0123456789wxyz", "/files", Some(&good))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, j) = call(&app, named("otherotherother", &uri, None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{j}");
    let forged = format!("/files?path=/a&signature=v1_{}", "B".repeat(43));
    let (s, j) = call(&app, named("abcdef0123456789wxyz", &forged, None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{j}");
    assert!(
        j["message"].as_str().unwrap().contains("does not match"),
        "{j}"
    );
}

/// envd access tokens are bound to a sandbox and expire; neither another sandbox's token
/// nor an expired one reaches Warren.
#[tokio::test]
async fn expired_and_other_sandboxes_tokens_are_refused() {
    let (app, key) = gateway();
    let list = |token: &str| {
        envd_call(
            "/process.Process/List",
            Some(token),
            "application/json",
            b"{}".to_vec(),
        )
    };
    let expired = keys::TokenKey::new(b"test", &key).issue(
        "key_test",
        "abcdef0123456789wxyz",
        crate::tokens::now() - 1,
    );
    let (s, j) = call(&app, list(&expired)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{j}");
    assert!(j["message"].as_str().unwrap().contains("expired"), "{j}");
    let (s, j) = call(&app, list(&token(&key, "anothersandbox"))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{j}");
    assert!(
        j["message"].as_str().unwrap().contains("not this sandbox"),
        "{j}"
    );
    // The old form (a hash of the gateway's key and the sandbox) is no token any more.
    let (s, _) = call(&app, list(&"0".repeat(40))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // A good one gets to Warren (unreachable: unavailable).
    let (s, j) = call(&app, list(&token(&key, "abcdef0123456789wxyz"))).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{j}");
}
