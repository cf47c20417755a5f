//! Rebuilding a sandbox from a trajectory log: its commands run again and its files are
//! written again, in order, before the replay starts answering.

use std::sync::Arc;

use warren_types::ByteSize;
use warren_types::api::{ExecRequest, TrajectoryEntry};

use crate::error::NodeError;
use crate::node::{Node, Sandbox};

impl Node {
    /// Re-applies a trajectory to a new sandbox: commands run again, files are written again.
    pub(crate) async fn rebuild(
        &self,
        sb: &Arc<Sandbox>,
        entries: &[TrajectoryEntry],
    ) -> Result<(), NodeError> {
        let id = &sb.record.id;
        for (i, e) in entries.iter().enumerate() {
            let step = |e: NodeError| {
                NodeError::Invalid(format!("replaying entry {i} of the trajectory: {e}"))
            };
            match e {
                TrajectoryEntry::Exec {
                    argv,
                    env,
                    cwd,
                    user,
                    stdin_b64,
                    result,
                    ..
                } => {
                    let req = ExecRequest {
                        argv: Some(argv.clone()),
                        env: env.clone(),
                        cwd: cwd.clone(),
                        user: Some(user.clone()),
                        stdin_b64: stdin_b64.clone(),
                        max_output: Some(ByteSize(
                            result
                                .status
                                .stdout_bytes
                                .max(result.status.stderr_bytes)
                                .max(1),
                        )),
                        ..ExecRequest::default()
                    };
                    let p = crate::exec::prepare(&req, Some(crate::exec::DEFAULT_EXEC_TIMEOUT))
                        .map_err(step)?;
                    self.exec_live(id, p).await.map_err(step)?;
                }
                TrajectoryEntry::WriteFile {
                    path,
                    user,
                    mode,
                    content_b64,
                    ..
                } => {
                    use base64::Engine;
                    let data = base64::engine::general_purpose::STANDARD
                        .decode(content_b64)
                        .map_err(|e| {
                            NodeError::Invalid(format!("trajectory entry {i}: content_b64: {e}"))
                        })?;
                    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(
                        bytes::Bytes::from(data),
                    )]);
                    self.write_file_live(
                        id,
                        path.clone(),
                        Some(user.clone()),
                        *mode,
                        Default::default(),
                        body,
                    )
                    .await
                    .map_err(step)?;
                }
            }
        }
        Ok(())
    }
}
