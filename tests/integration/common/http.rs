//! The management HTTP API as tests call it: a `reqwest` client with Basic credentials,
//! bounded waits, and answers as (status, JSON).

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{Broker, WAIT};

/// A client of one broker's management API.
pub struct Api {
    /// `http://host:port`.
    pub base: String,
    /// The client.
    pub http: reqwest::Client,
    /// Credentials (none: anonymous).
    pub user: Option<(String, String)>,
}

impl Api {
    pub fn of(broker: &Broker) -> Api {
        let addr = broker.http.expect("the harness opens an HTTP listener");
        Api {
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            user: Some(("guest".into(), "guest".into())),
        }
    }

    pub fn as_user(&self, user: &str, pass: &str) -> Api {
        Api { base: self.base.clone(), http: self.http.clone(), user: Some((user.into(), pass.into())) }
    }

    pub fn anonymous(&self) -> Api {
        Api { base: self.base.clone(), http: self.http.clone(), user: None }
    }

    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self.http.request(method.clone(), format!("{}{path}", self.base));
        if let Some((u, p)) = &self.user {
            req = req.basic_auth(u, Some(p));
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = tokio::time::timeout(WAIT, req.send())
            .await
            .unwrap_or_else(|_| panic!("{method} {path} did not answer in time"))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let json =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        (status, json)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    pub async fn ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::DELETE, path, None).await
    }
}
