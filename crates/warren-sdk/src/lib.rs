//! Rust SDK for Warren (placeholder).
