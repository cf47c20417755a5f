//! The trajectory log and its replay (the paper's fast-forward).
//!
//! - `log`: recording a sandbox's operations, and answering a replay's matching leading
//!   operations with their recorded results.
//! - `rebuild`: re-applying a log to a new sandbox to rebuild its state.

pub mod log;
pub mod rebuild;
