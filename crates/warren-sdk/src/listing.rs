//! Answers Warren gathers from every node, and the nodes that did not answer.
//!
//! A list or count that Warren asks every node for names the nodes that gave no answer
//! (down, unreachable, too slow): their part is missing. [`Listing`] holds a list and those
//! nodes; [`Gathered`] (from the API types) holds any other such answer, e.g. a task
//! operation's [`TaskResult`](crate::TaskResult). Both deref to the answer, so code that does
//! not care reads it as before; code that does checks [`Listing::is_complete`].

use std::ops::Deref;

use warren_types::api::NodeFailure;

/// Items gathered from every node, and the nodes whose items are missing.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing<T> {
    /// The items, from the nodes that answered.
    pub items: Vec<T>,
    /// The nodes that did not answer, with why; empty when every node did.
    pub unreachable: Vec<NodeFailure>,
}

impl<T> Listing<T> {
    /// Whether every node answered, so that no item is missing.
    pub fn is_complete(&self) -> bool {
        self.unreachable.is_empty()
    }

    /// The items alone.
    pub fn into_items(self) -> Vec<T> {
        self.items
    }
}

impl<T> Deref for Listing<T> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        &self.items
    }
}

impl<T> IntoIterator for Listing<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a, T> IntoIterator for &'a Listing<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}
