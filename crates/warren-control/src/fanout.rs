//! Asking every node at once, with an explicit policy for the nodes that give no answer.
//!
//! [`ask`] sends one call per node, all at once, and keeps each node's answer or why there is
//! none (each call is bounded in time and size by [`crate::node_api::NodeApi`]). Then
//! [`Answers::under`] judges them by a [`Policy`]:
//!
//! - [`Policy::AllOrFail`]: every node must answer, or the call fails (503) naming the nodes
//!   that did not. For decisions that a missing node could make wrong (removing an image that a
//!   sandbox on that node might use).
//! - [`Policy::Partial`]: the answer is what the nodes that answered said, and names the others
//!   (`unreachable` in the body, [`Gathered`]); it fails (503) only when nodes were asked and
//!   none answered. For lists, counts and task operations.
//!
//! Under either policy, a node that finds the request itself wrong (`invalid_argument`: a bad
//! filter) fails the whole call with its error: it is the caller's to fix, whichever node says
//! so first. A list or count never leaves a node out without naming it.

use std::future::Future;
use std::sync::Arc;

use warren_http::Error;
use warren_types::api::{Gathered, NodeFailure};
use warren_types::error::{ApiError, ErrorCode};

use crate::api::forward::unavailable;
use crate::node_api::CallError;
use crate::nodes::NodeEntry;

/// What a multi-node call does about nodes that give no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every node must answer, or the call fails naming the nodes that did not.
    AllOrFail,
    /// Answer with what the nodes that answered said, naming the others; fail only when none
    /// answered.
    Partial,
}

/// Each node's answer to one call, or why there is none.
#[derive(Debug)]
pub struct Answers<T> {
    /// The answers, in node order.
    parts: Vec<T>,
    /// The nodes that gave none, in node order.
    unreachable: Vec<NodeFailure>,
    /// The first error a node found in the request itself.
    bad_request: Option<ApiError>,
}

/// Asks every node in `nodes` with `call`, all at once, and waits for every answer (each call
/// is bounded in time by the [`NodeApi`](crate::node_api::NodeApi) it uses).
pub async fn ask<T, F, Fut>(nodes: Vec<Arc<NodeEntry>>, call: F) -> Answers<T>
where
    F: Fn(Arc<NodeEntry>) -> Fut,
    Fut: Future<Output = Result<T, CallError>>,
{
    let calls = nodes.into_iter().map(|n| {
        let fut = call(n.clone());
        async move { (n, fut.await) }
    });
    let mut out = Answers {
        parts: Vec::new(),
        unreachable: Vec::new(),
        bad_request: None,
    };
    for (node, r) in futures_util::future::join_all(calls).await {
        match r {
            Ok(t) => out.parts.push(t),
            Err(e) => out.fail(&node, e),
        }
    }
    out
}

impl<T> Answers<T> {
    /// Records that `node` gave no answer, and why.
    fn fail(&mut self, node: &NodeEntry, e: CallError) {
        let error = match e {
            CallError::Refused(e) if e.code == ErrorCode::InvalidArgument => {
                self.bad_request.get_or_insert(e);
                return;
            }
            CallError::Refused(e) => e,
            CallError::Unreachable(why) => unavailable(node, &why).0,
        };
        self.unreachable.push(NodeFailure {
            node: node.id.clone(),
            error,
        });
    }

    /// The nodes that gave no answer, before any policy is applied.
    pub fn unreachable(&self) -> &[NodeFailure] {
        &self.unreachable
    }

    /// Judges the answers by `policy`; `what` says what was being done, for the error
    /// (`"listing sandboxes"`). On success, the parts and the nodes that gave none.
    pub fn under(self, policy: Policy, what: &str) -> Result<Gathered<Vec<T>>, Error> {
        if let Some(e) = self.bad_request {
            return Err(Error(e));
        }
        if self.unreachable.is_empty() {
            return Ok(Gathered::complete(self.parts));
        }
        let why = self
            .unreachable
            .iter()
            .map(|f| format!("node {}: {}", f.node, f.error.message))
            .collect::<Vec<_>>()
            .join("; ");
        match policy {
            Policy::AllOrFail => Err(Error(ApiError::new(
                ErrorCode::Unavailable,
                format!(
                    "{what} needs an answer from every node, and {} of {} did not answer ({why}); retry when they do",
                    self.unreachable.len(),
                    self.unreachable.len() + self.parts.len()
                ),
            ))),
            Policy::Partial if self.parts.is_empty() => Err(Error(ApiError::new(
                ErrorCode::Unavailable,
                format!("{what}: no node answered ({why}); check the node daemons"),
            ))),
            Policy::Partial => {
                tracing::warn!(
                    missing = self.unreachable.len(),
                    "{what}: answering without the nodes that did not answer: {why}"
                );
                Ok(Gathered {
                    answer: self.parts,
                    unreachable: self.unreachable,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(node: &str, code: ErrorCode) -> NodeFailure {
        NodeFailure {
            node: node.parse().unwrap(),
            error: ApiError::new(code, format!("{node} is down")),
        }
    }

    fn answers(parts: Vec<u32>, down: &[&str], bad: Option<&str>) -> Answers<u32> {
        Answers {
            parts,
            unreachable: down
                .iter()
                .map(|n| failure(n, ErrorCode::Unavailable))
                .collect(),
            bad_request: bad.map(ApiError::invalid),
        }
    }

    #[test]
    fn every_node_answering_is_a_complete_answer_under_either_policy() {
        for p in [Policy::AllOrFail, Policy::Partial] {
            let g = answers(vec![1, 2], &[], None).under(p, "counting").unwrap();
            assert_eq!(g.answer, vec![1, 2]);
            assert!(g.is_complete());
        }
        // No nodes at all: nothing is missing.
        let g = answers(vec![], &[], None)
            .under(Policy::Partial, "counting")
            .unwrap();
        assert!(g.answer.is_empty() && g.is_complete());
    }

    #[test]
    fn partial_answers_name_each_missing_node() {
        let g = answers(vec![7], &["nodebb", "nodecc"], None)
            .under(Policy::Partial, "counting")
            .unwrap();
        assert_eq!(g.answer, vec![7]);
        let missing: Vec<String> = g.unreachable.iter().map(|f| f.node.to_string()).collect();
        assert_eq!(missing, ["nodebb", "nodecc"]);
    }

    #[test]
    fn partial_fails_when_no_node_answered_and_names_them() {
        let e = answers(vec![], &["nodebb"], None)
            .under(Policy::Partial, "listing sandboxes")
            .unwrap_err();
        assert_eq!(e.0.code, ErrorCode::Unavailable);
        assert!(
            e.0.message
                .starts_with("listing sandboxes: no node answered")
                && e.0.message.contains("node nodebb: nodebb is down"),
            "{}",
            e.0.message
        );
    }

    #[test]
    fn all_or_fail_fails_on_one_missing_node_and_names_it() {
        let e = answers(vec![1, 2], &["nodecc"], None)
            .under(Policy::AllOrFail, "removing an image")
            .unwrap_err();
        assert_eq!(e.0.code, ErrorCode::Unavailable);
        assert!(
            e.0.message.contains("1 of 3 did not answer") && e.0.message.contains("node nodecc"),
            "{}",
            e.0.message
        );
    }

    #[test]
    fn a_bad_request_is_the_callers_error_under_either_policy() {
        for p in [Policy::AllOrFail, Policy::Partial] {
            let e = answers(vec![1], &["nodecc"], Some("bad filter"))
                .under(p, "listing")
                .unwrap_err();
            assert_eq!(e.0.code, ErrorCode::InvalidArgument);
            assert_eq!(e.0.message, "bad filter");
        }
    }
}
