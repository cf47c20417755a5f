//! control plane (placeholder)
