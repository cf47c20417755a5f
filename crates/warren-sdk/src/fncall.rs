//! Function calls: a program run once on a warm worker (an online judge's submission, a reward
//! script), stateless.
//!
//! ```no_run
//! # async fn f(c: &warren_sdk::Client) -> warren_sdk::Result<()> {
//! let r = c
//!     .fncall(&warren_sdk::FnCallRequest {
//!         language: "python".into(),
//!         code: "print(int(input()) * 2)".into(),
//!         stdin: Some("21\n".into()),
//!         ..Default::default()
//!     })
//!     .await?;
//! assert_eq!(r.run.unwrap().stdout, "42\n");
//! # Ok(()) }
//! ```

use reqwest::Method;
use warren_types::fncall::{FnCallRequest, FnCallResult, LanguageInfo, LanguageList};

use crate::client::Client;
use crate::error::Result;

impl Client {
    /// Runs a program once (`POST /v1/fncall/run`).
    pub async fn fncall(&self, req: &FnCallRequest) -> Result<FnCallResult> {
        let rb = self
            .request(Method::POST, self.endpoint("/v1/fncall/run", &[])?)
            .json(req);
        self.json(rb).await
    }

    /// The languages function calls know (`GET /v1/fncall/languages`).
    pub async fn fncall_languages(&self) -> Result<Vec<LanguageInfo>> {
        let rb = self.request(Method::GET, self.endpoint("/v1/fncall/languages", &[])?);
        let l: LanguageList = self.json(rb).await?;
        Ok(l.languages)
    }
}

impl Client {
    /// Runs one program over many test cases (`POST /v1/fncall/batch`): compiled once, the
    /// cases spread over workers, each judged by the checker.
    pub async fn fncall_batch(
        &self,
        req: &warren_types::fncall::FnCallBatchRequest,
    ) -> Result<warren_types::fncall::FnCallBatchResult> {
        let rb = self
            .request(Method::POST, self.endpoint("/v1/fncall/batch", &[])?)
            .json(req);
        self.json(rb).await
    }
}
