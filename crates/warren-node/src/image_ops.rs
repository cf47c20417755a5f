//! The node's side of images: turning a sandbox's changes into a layer (`image build`), and
//! read statistics of mounted layers and of sandboxes.

use std::sync::Arc;

use warren_types::api::{ImageStats, Layer, LayerStats, SandboxReadStats};
use warren_types::id::SandboxId;

use crate::error::NodeError;
use crate::node::{Node, blocking};
use crate::phase::{Action, Phase};

impl Node {
    /// Writes the sandbox's writable layer to the store as a new layer (the control plane
    /// names it). The sandbox is frozen meanwhile and its lifecycle lock held, so no exec or
    /// file request can thaw it before the copy is done: the layer is one consistent state.
    /// The copy is made by descriptor, following none of the links the sandbox made, and
    /// leaves the live layer as it was.
    pub async fn commit(
        self: &Arc<Self>,
        id: &SandboxId,
        creator: &str,
    ) -> Result<Layer, NodeError> {
        let sb = self.get(id)?;
        if sb.record.layers.is_empty() {
            return Err(NodeError::Invalid(
                "only a sandbox made from imported images can be committed: the built-in host \
                 image is not a layer (create the builder with --image <name>)"
                    .into(),
            ));
        }
        let Some(store) = self.images.store.clone() else {
            return Err(NodeError::host(
                "committing",
                std::io::Error::other("this node's image store is unusable (see its log)"),
            ));
        };
        let Some(upper) = sb.instance.writable_layer() else {
            return Err(NodeError::Invalid(format!(
                "a {} sandbox has no writable layer to commit",
                sb.record.backend
            )));
        };
        let _g = sb.lifecycle.lock().await;
        self.legal(&sb, Action::Commit)?;
        let was_paused = sb.phase() == Phase::Paused;
        if !was_paused {
            let s = sb.clone();
            blocking(move || s.instance.set_frozen(true))
                .await
                .map_err(|e| NodeError::host("freezing the sandbox", e))?;
            sb.set_phase(Phase::Paused);
        }
        let creator = creator.to_string();
        let result = blocking(move || {
            Ok(warren_images::store::commit_upper(
                &store, &upper, "build", &creator,
            ))
        })
        .await
        .map_err(|e| NodeError::host("committing", e));
        if !was_paused {
            let s = sb.clone();
            match blocking(move || s.instance.set_frozen(false)).await {
                Ok(()) => sb.set_phase(Phase::Running),
                Err(e) => tracing::error!(sandbox_id = %id, "thawing after the commit: {e}"),
            }
        }
        Ok(result??)
    }

    /// How this node's mounted layers and layered sandboxes have been read.
    pub fn image_stats(&self) -> ImageStats {
        let mounts = self.layers.stats();
        // A running sandbox's layers are all mounted: their sizes come from the mounts, not
        // from the store (which may be a remote file system).
        let sizes: std::collections::HashMap<&str, u64> =
            mounts.iter().map(|m| (m.digest.as_str(), m.size)).collect();
        let sandboxes: Vec<_> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| !s.record.layers.is_empty())
            .cloned()
            .collect();
        let sandboxes = sandboxes
            .into_iter()
            .map(|sb| {
                let image_size: u64 = sb
                    .record
                    .layers
                    .iter()
                    .filter_map(|d| sizes.get(d.as_str()))
                    .sum();
                let read_bytes = sb.instance.read_bytes();
                SandboxReadStats {
                    id: sb.record.id.clone(),
                    image: sb.record.image.clone(),
                    layers: sb.record.layers.clone(),
                    image_size,
                    read_bytes,
                    read_fraction: fraction(read_bytes, image_size),
                }
            })
            .collect();
        let layers = mounts
            .into_iter()
            .map(|m| LayerStats {
                node: self.id.clone(),
                read_fraction: fraction(m.read_bytes, m.size),
                digest: m.digest,
                size: m.size,
                mode: m.mode.name().into(),
                read_bytes: m.read_bytes,
                sandboxes: m.refs,
            })
            .collect();
        ImageStats { layers, sandboxes }
    }
}

fn fraction(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}
