//! File operations on trees that someone else controls: an archive being unpacked, a
//! sandbox's writable layer, a directory a sandbox could have changed.
//!
//! The rule: a path is never handed to the kernel whole. Each directory is opened from its
//! parent's descriptor with `O_NOFOLLOW`, so a symbolic link planted anywhere on the way is
//! refused instead of followed, and each change (owner, mode, times, attributes, removal) is
//! made through a descriptor or relative to one. Walks keep a bounded number of descriptors
//! open and use no recursion, so a tree 100,000 directories deep costs neither.
//!
//! - [`Beneath`]: opening directories below a root, one component at a time.
//! - [`meta`]: owner, mode, times and extended attributes of one entry, never through a link.
//! - [`remove_tree`]: iterative removal.
//! - [`copy_tree`]: an iterative copy (for snapshots of a layer).

mod copy;
pub mod meta;
mod remove;
mod walk;

pub use copy::{CopyStats, copy_tree, names};
pub use remove::{remove_path, remove_tree};
pub use walk::{Beneath, Links, check_relative, open_dir_beneath, open_file};

use std::io;

/// An error with what was being done and to which entry.
pub(crate) fn ctx(e: impl Into<io::Error>, what: &str, name: impl std::fmt::Debug) -> io::Error {
    let e: io::Error = e.into();
    io::Error::new(e.kind(), format!("{what} {name:?}: {e}"))
}
