//! Warren's image layer store.
//!
//! A layer is one EROFS file named by the SHA-256 digest of its bytes. (Images — names pointing
//! at ordered lists of layers — are the control plane's catalog, in its database.) The store is
//! a directory — on one machine `<data-dir>/images`, in a cluster a directory on a shared file
//! system mounted on every node — laid out as:
//!
//! ```text
//! layers/sha256-<hex>.erofs   the layer files (written once, never changed)
//! layers/sha256-<hex>.json    their metadata
//! tmp/<host>.<pid>.<random>/  work in progress; removed at the next start once its process is gone
//! ```
//!
//! A layer becomes visible by an atomic rename at the end, so an interrupted import leaves only
//! temporary files, never a half-written layer.
//!
//! [`import`] turns directories, tarballs (plain, gzip, zstd), OCI image layouts and
//! `docker save` archives into layers; [`unpack`] is the careful tar extractor underneath.

pub mod import;
pub mod names;
pub mod store;
pub mod unpack;

pub use store::Store;

use warren_types::error::{ApiError, ErrorCode};

/// What went wrong with an image operation; each maps to one API error code
/// ([`ImageError::code`]), the same wherever it is reported (control plane or node).
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The caller's input is wrong (bad name, bad archive, escaping path); HTTP 400.
    #[error("{0}")]
    Invalid(String),
    /// No such image or layer; HTTP 404.
    #[error("{0}")]
    NotFound(String),
    /// The operation conflicts with a use (a layer in use, a name taken); HTTP 409.
    #[error("{0}")]
    Conflict(String),
    /// Over a size limit; HTTP 413.
    #[error("{0}")]
    TooLarge(String),
    /// The store's disk is full.
    #[error("{0}: no space left in the image store; free space or move the store (--image-store)")]
    NoSpace(String),
    /// A host-side failure.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

impl ImageError {
    /// The API error code for this error. The control plane and the nodes both report image
    /// errors through this one mapping. A full store is `unavailable` (503): the store, not
    /// the request, has to change, and a retry succeeds once there is room.
    pub fn code(&self) -> ErrorCode {
        match self {
            ImageError::Invalid(_) => ErrorCode::InvalidArgument,
            ImageError::NotFound(_) => ErrorCode::ImageNotFound,
            ImageError::Conflict(_) => ErrorCode::Conflict,
            ImageError::TooLarge(_) => ErrorCode::PayloadTooLarge,
            ImageError::NoSpace(_) => ErrorCode::Unavailable,
            ImageError::Io { .. } => ErrorCode::Internal,
        }
    }

    /// The error as the API reports it: [`code`](Self::code) and the message.
    pub fn to_api(&self) -> ApiError {
        ApiError::new(self.code(), self.to_string())
    }

    /// Wraps an I/O error with what was being done; a full disk becomes [`ImageError::NoSpace`].
    pub fn io(what: impl Into<String>, source: std::io::Error) -> ImageError {
        let what = what.into();
        if source.raw_os_error() == Some(28) {
            return ImageError::NoSpace(what);
        }
        ImageError::Io { what, source }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// RFC 3339 time of `ms` since the epoch.
pub fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_image_error_has_one_code() {
        let cases = [
            (
                ImageError::Invalid("bad".into()),
                ErrorCode::InvalidArgument,
                400,
            ),
            (
                ImageError::NotFound("no".into()),
                ErrorCode::ImageNotFound,
                404,
            ),
            (
                ImageError::Conflict("in use".into()),
                ErrorCode::Conflict,
                409,
            ),
            (
                ImageError::TooLarge("big".into()),
                ErrorCode::PayloadTooLarge,
                413,
            ),
            (
                ImageError::io("writing", std::io::Error::from_raw_os_error(28)),
                ErrorCode::Unavailable,
                503,
            ),
            (
                ImageError::io("writing", std::io::Error::other("broken")),
                ErrorCode::Internal,
                500,
            ),
        ];
        for (e, code, status) in cases {
            assert_eq!(e.code(), code, "{e}");
            let api = e.to_api();
            assert_eq!(api.code.http_status(), status);
            assert_eq!(api.message, e.to_string());
        }
    }
}
