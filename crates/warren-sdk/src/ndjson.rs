//! Newline-delimited JSON bodies (streaming exec, process output): bytes in, values out.

use std::collections::VecDeque;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// Splits arriving chunks into complete lines, keeping a partial last line for the next chunk.
#[derive(Debug, Default)]
pub(crate) struct LineBuffer {
    pending: Vec<u8>,
}

impl LineBuffer {
    /// Adds a chunk; returns the lines it completed, without their `\n` (or `\r\n`), skipping
    /// blank ones.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(at) = rest.iter().position(|b| *b == b'\n') {
            self.pending.extend_from_slice(&rest[..at]);
            rest = &rest[at + 1..];
            let line = std::mem::take(&mut self.pending);
            if let Some(line) = non_blank(line) {
                lines.push(line);
            }
        }
        self.pending.extend_from_slice(rest);
        lines
    }

    /// The last line when the body ended without a final newline.
    pub(crate) fn finish(&mut self) -> Option<Vec<u8>> {
        non_blank(std::mem::take(&mut self.pending))
    }
}

fn non_blank(mut line: Vec<u8>) -> Option<Vec<u8>> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    (!line.iter().all(u8::is_ascii_whitespace)).then_some(line)
}

/// Parses one line as a `T`; the error quotes the start of the line.
pub(crate) fn parse_line<T: DeserializeOwned>(line: &[u8]) -> Result<T> {
    serde_json::from_slice(line).map_err(|e| {
        let text = String::from_utf8_lossy(line);
        let shown: String = text.chars().take(120).collect();
        Error::Decode(format!(
            "could not understand a line of Warren's event stream ({e}): {shown}"
        ))
    })
}

/// The values of an NDJSON body, one per line, as they arrive.
pub(crate) fn values<T, S>(body: S) -> impl Stream<Item = Result<T>>
where
    T: DeserializeOwned,
    S: Stream<Item = reqwest::Result<Bytes>> + Unpin,
{
    struct State<S, T> {
        body: S,
        lines: LineBuffer,
        ready: VecDeque<Result<T>>,
        done: bool,
    }
    let state = State {
        body,
        lines: LineBuffer::default(),
        ready: VecDeque::new(),
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(v) = st.ready.pop_front() {
                return Some((v, st));
            }
            if st.done {
                return None;
            }
            match st.body.next().await {
                Some(Ok(chunk)) => {
                    let parsed = st.lines.push(&chunk).into_iter().map(|l| parse_line(&l));
                    st.ready.extend(parsed);
                }
                Some(Err(e)) => {
                    st.done = true;
                    st.ready.push_back(Err(Error::Transport(e)));
                }
                None => {
                    st.done = true;
                    if let Some(line) = st.lines.finish() {
                        st.ready.push_back(parse_line(&line));
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_are_joined() {
        let mut buf = LineBuffer::default();
        assert!(buf.push(b"{\"a\":").is_empty());
        assert_eq!(buf.push(b"1}\n{\"b\""), vec![b"{\"a\":1}".to_vec()]);
        assert_eq!(buf.push(b":2}\r\n\n  \n"), vec![b"{\"b\":2}".to_vec()]);
        assert_eq!(buf.finish(), None);
        buf.push(b"{\"c\":3}");
        assert_eq!(buf.finish(), Some(b"{\"c\":3}".to_vec()));
        assert_eq!(buf.finish(), None);
    }

    #[test]
    fn many_lines_in_one_chunk_come_out_in_order() {
        let mut buf = LineBuffer::default();
        let lines = buf.push(b"1\n2\n3\n4");
        assert_eq!(lines, vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
        assert_eq!(buf.finish(), Some(b"4".to_vec()));
    }

    #[test]
    fn a_bad_line_is_a_decode_error_that_quotes_it() {
        let err = parse_line::<serde_json::Value>(b"not json").unwrap_err();
        assert!(matches!(err, Error::Decode(_)));
        assert!(err.to_string().contains("not json"), "{err}");
    }

    #[tokio::test]
    async fn a_body_becomes_values() {
        let chunks: Vec<reqwest::Result<Bytes>> = vec![
            Ok(Bytes::from_static(b"{\"n\":1}\n{\"n\"")),
            Ok(Bytes::from_static(b":2}\n")),
            Ok(Bytes::from_static(b"{\"n\":3}")),
        ];
        let body = futures_util::stream::iter(chunks);
        let got: Vec<serde_json::Value> = values(body).map(|v| v.unwrap()).collect().await;
        let ns: Vec<i64> = got.iter().map(|v| v["n"].as_i64().unwrap()).collect();
        assert_eq!(ns, vec![1, 2, 3]);
    }
}
