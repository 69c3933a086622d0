//! The management API's client: blocking HTTP/1.1 calls through `ureq` (plain HTTP on
//! loopback or a trusted network), every answer returned whatever its status.

use std::time::Duration;

use base64::Engine;

/// The largest answer read (a definitions export of a big broker fits).
const MAX_ANSWER_BYTES: u64 = 1 << 30;

/// Why a call failed before an HTTP answer came.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://host[:port][/prefix]`.
    #[error("bad URL `{0}` (expected http://HOST:PORT)")]
    Url(String),
    /// The broker could not be reached, the connection broke, or the answer is not HTTP.
    #[error("cannot reach the broker at {0}: {1}")]
    Http(String, Box<ureq::Error>),
}

/// An answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status code.
    pub status: u16,
    /// Body as text.
    pub body: String,
}

/// Where the API is and who calls it.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    authorization: String,
    agent: ureq::Agent,
}

impl Client {
    /// A client of `url` (`http://127.0.0.1:15672`, optionally with a path prefix) with
    /// Basic credentials.
    pub fn new(url: &str, user: &str, password: &str) -> Result<Client, ClientError> {
        let rest = url.strip_prefix("http://").ok_or_else(|| ClientError::Url(url.to_owned()))?;
        if rest.is_empty() || rest.starts_with('/') {
            return Err(ClientError::Url(url.to_owned()));
        }
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Client { base: url.trim_end_matches('/').to_owned(), authorization: format!("Basic {credentials}"), agent })
    }

    /// Sends `method path` with an optional JSON body and extra headers.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, ClientError> {
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("authorization", &self.authorization)
            .header("accept", "application/json");
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(body.unwrap_or("").to_owned()).map_err(|_| ClientError::Url(self.base.clone()))?;
        let failed = |e| ClientError::Http(self.base.clone(), Box::new(e));
        let mut answer = self.agent.run(request).map_err(failed)?;
        let status = answer.status().as_u16();
        let body = answer.body_mut().with_config().limit(MAX_ANSWER_BYTES).read_to_string().map_err(failed)?;
        Ok(Answer { status, body })
    }
}
