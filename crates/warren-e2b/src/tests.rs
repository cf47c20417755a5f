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
    };
    (router(Arc::new(gw)), key)
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
    let (app, key) = gateway();
    let (s, j) = call(&app, post("/v2/sandboxes", None, "{}")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(j["code"], 401);
    assert!(j["message"].as_str().unwrap().contains("X-API-KEY"), "{j}");
    let (s, j) = call(&app, post("/v2/sandboxes", Some(&keys::new_key()), "{}")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(
        j["message"].as_str().unwrap().contains("invalid API key"),
        "{j}"
    );
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
            .header("x-api-key", format!("{key}0"))
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
        ("{", "not a NewSandbox"),
        (r#"{"templateID": 5}"#, "not a NewSandbox"),
        (r#"{"timeout": -1}"#, "not a NewSandbox"),
        (r#"{"autoPause": true}"#, "autoPause"),
        (r#"{"network": {"allowOut": ["1.2.3.4"]}}"#, "network"),
    ] {
        let (s, j) = call(&app, post("/v2/sandboxes", k, body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {j}");
        assert!(
            j["message"].as_str().unwrap().contains(words),
            "{body}: {j}"
        );
    }
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
