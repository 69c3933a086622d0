//! JSON shapes several calls share: header values and arguments as RabbitMQ shows them,
//! and list pagination (`?page=&page_size=&name=&use_regex=`, answering
//! `{items, page, page_count, page_size, total_count, filtered_count, item_count}`).

use serde::Deserialize;
use serde_json::{json, Map, Value as Json};

use super::error::ApiError;
use crate::core::value::Value;

/// Largest `page_size` RabbitMQ accepts.
pub const MAX_PAGE_SIZE: usize = 500;

/// A header value as JSON (numbers, strings, booleans, arrays and tables as they are;
/// bytes as text when they are UTF-8).
pub fn value_json(v: &Value) -> Json {
    match v {
        Value::Bool(b) => json!(b),
        Value::Int8(i) => json!(i),
        Value::UInt8(i) => json!(i),
        Value::Int16(i) => json!(i),
        Value::UInt16(i) => json!(i),
        Value::Int32(i) => json!(i),
        Value::UInt32(i) => json!(i),
        Value::Int(i) => json!(i),
        Value::UInt(i) => json!(i),
        Value::Float(f) => json!(f),
        Value::Double(f) => json!(f),
        Value::Decimal(..) => json!(v.to_text()),
        Value::Str(s) => json!(s),
        Value::Bytes(b) => json!(String::from_utf8_lossy(b)),
        Value::Timestamp(t) => json!(t),
        Value::Array(a) => Json::Array(a.iter().map(value_json).collect()),
        Value::Table(t) => table_json(t),
        Value::Void => Json::Null,
    }
}

/// A field table as a JSON object.
pub fn table_json(t: &[(String, Value)]) -> Json {
    Json::Object(t.iter().map(|(k, v)| (k.clone(), value_json(v))).collect::<Map<_, _>>())
}

/// A JSON value as a header value (integers as 64-bit, as RabbitMQ's API stores them).
pub fn json_value(j: &Json) -> Value {
    match j {
        Json::Null => Value::Void,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::Int(i),
            (None, Some(u)) => Value::UInt(u),
            _ => Value::Double(n.as_f64().unwrap_or(0.0)),
        },
        Json::String(s) => Value::Str(s.clone()),
        Json::Array(a) => Value::Array(a.iter().map(json_value).collect()),
        Json::Object(o) => Value::Table(json_table(o)),
    }
}

/// A JSON object as a field table.
pub fn json_table(o: &Map<String, Json>) -> Vec<(String, Value)> {
    o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect()
}

/// `{"rate": r}`.
pub fn rate(r: f64) -> Json {
    json!({ "rate": r })
}

/// A predicate on item names.
type NameFilter = Box<dyn Fn(&str) -> bool>;

/// The query of a list call.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    /// Page number, from 1; without it the answer is a plain array.
    pub page: Option<usize>,
    /// Items per page (default 100, at most 500).
    pub page_size: Option<usize>,
    /// Only items whose name contains this (or matches it, with `use_regex`).
    pub name: Option<String>,
    /// `name` is a regular expression.
    pub use_regex: Option<String>,
    /// Field to sort by (default: vhost then name).
    pub sort: Option<String>,
    /// Sort in reverse.
    pub sort_reverse: Option<String>,
    /// Only these fields, comma separated.
    pub columns: Option<String>,
    /// Leave out message rates and message counts (`enable_queue_totals` brings the counts back).
    pub disable_stats: Option<String>,
    /// With `disable_stats`, still show message counts.
    pub enable_queue_totals: Option<String>,
}

/// True for a query flag given as `true` (or `1`).
pub fn flag(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("true") | Some("1"))
}

impl ListQuery {
    /// The name filter as a predicate.
    fn matcher(&self) -> Result<NameFilter, ApiError> {
        match self.name.as_deref().filter(|n| !n.is_empty()) {
            None => Ok(Box::new(|_| true)),
            Some(pattern) if flag(&self.use_regex) => {
                let re = regex_lite::Regex::new(pattern)
                    .map_err(|e| ApiError::bad_request(format!("invalid regular expression: {e}")))?;
                Ok(Box::new(move |name| re.is_match(name)))
            }
            Some(part) => {
                let part = part.to_lowercase();
                Ok(Box::new(move |name| name.to_lowercase().contains(&part)))
            }
        }
    }
}

/// Answers a list: `items` are in (vhost, name) order with their names; `show` turns the
/// ones answered into JSON (only the page's, when paged). Sorting by another field than
/// the name, reversing and choosing columns work on the JSON.
pub fn list<T>(
    items: Vec<(String, T)>,
    q: &ListQuery,
    show: impl Fn(&T) -> Json,
) -> Result<axum::Json<Json>, ApiError> {
    let total = items.len();
    let matches = q.matcher()?;
    let filtered: Vec<(String, T)> = items.into_iter().filter(|(n, _)| matches(n)).collect();
    let by_name = q.sort.as_deref().is_none_or(|s| s == "name" || s.is_empty());
    let reverse = flag(&q.sort_reverse);
    let finish = |mut rows: Vec<Json>| -> Vec<Json> {
        if !by_name {
            let key = q.sort.clone().unwrap_or_default();
            rows.sort_by(|a, b| compare(field(a, &key), field(b, &key)));
        }
        if reverse {
            rows.reverse();
        }
        if let Some(cols) = &q.columns {
            let cols: Vec<&str> = cols.split(',').map(str::trim).collect();
            for row in &mut rows {
                if let Json::Object(o) = row {
                    o.retain(|k, _| cols.contains(&k.as_str()));
                }
            }
        }
        rows
    };
    let Some(page) = q.page else {
        let rows = filtered.iter().map(|(_, t)| show(t)).collect();
        return Ok(axum::Json(Json::Array(finish(rows))));
    };
    let page_size = q.page_size.unwrap_or(100);
    if page == 0 || page_size == 0 || page_size > MAX_PAGE_SIZE {
        return Err(ApiError::bad_request(format!(
            "page and page_size must be at least 1, page_size at most {MAX_PAGE_SIZE}"
        )));
    }
    let filtered_count = filtered.len();
    let page_count = filtered_count.div_ceil(page_size).max(1);
    if page > page_count {
        return Err(ApiError::bad_request("page out of range"));
    }
    let rows: Vec<Json> = if by_name && !reverse {
        filtered.iter().skip((page - 1) * page_size).take(page_size).map(|(_, t)| show(t)).collect()
    } else {
        let all = finish(filtered.iter().map(|(_, t)| show(t)).collect());
        all.into_iter().skip((page - 1) * page_size).take(page_size).collect()
    };
    let rows = if by_name && !reverse { finish(rows) } else { rows };
    Ok(axum::Json(json!({
        "items": rows,
        "page": page,
        "page_count": page_count,
        "page_size": page_size,
        "total_count": total,
        "filtered_count": filtered_count,
        "item_count": rows.len(),
    })))
}

/// A (dotted) field of a JSON row.
fn field<'a>(row: &'a Json, key: &str) -> Option<&'a Json> {
    key.split('.').try_fold(row, |v, k| v.get(k))
}

fn compare(a: Option<&Json>, b: Option<&Json>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(Json::Number(x)), Some(Json::Number(y))) => {
            x.as_f64().unwrap_or(0.0).partial_cmp(&y.as_f64().unwrap_or(0.0)).unwrap_or(std::cmp::Ordering::Equal)
        }
        (Some(x), Some(y)) => x.to_string().cmp(&y.to_string()),
        (a, b) => a.is_some().cmp(&b.is_some()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<(String, usize)> {
        (0..n).map(|i| (format!("q{i:03}"), i)).collect()
    }

    #[test]
    fn a_page_answers_rabbitmqs_envelope() {
        let q = ListQuery { page: Some(2), page_size: Some(10), ..Default::default() };
        let j = list(names(25), &q, |i| json!({ "name": format!("q{i:03}") })).unwrap().0;
        assert_eq!(j["page"], 2);
        assert_eq!(j["page_count"], 3);
        assert_eq!(j["total_count"], 25);
        assert_eq!(j["filtered_count"], 25);
        assert_eq!(j["item_count"], 10);
        assert_eq!(j["items"][0]["name"], "q010");
        let q = ListQuery { page: Some(4), page_size: Some(10), ..Default::default() };
        assert!(list(names(25), &q, |_| json!({})).is_err(), "past the last page");
    }

    #[test]
    fn names_filter_by_substring_or_regex() {
        let q = ListQuery { page: Some(1), name: Some("q01".into()), ..Default::default() };
        let j = list(names(25), &q, |i| json!({ "n": i })).unwrap().0;
        assert_eq!(j["filtered_count"], 10);
        let q = ListQuery { name: Some("^q02[0-2]$".into()), use_regex: Some("true".into()), ..Default::default() };
        let j = list(names(25), &q, |i| json!({ "n": i })).unwrap().0;
        assert_eq!(j.as_array().unwrap().len(), 3);
    }

    #[test]
    fn header_values_round_trip_through_json() {
        let t = vec![("a".to_string(), Value::Int(1)), ("b".to_string(), Value::Str("x".into()))];
        let j = table_json(&t);
        assert_eq!(j, json!({ "a": 1, "b": "x" }));
        assert_eq!(json_table(j.as_object().unwrap()), t);
    }
}

/// A request body as JSON; a body that does not parse is a RabbitMQ-style 400 (not axum's
/// 422), and an empty body reads as `{}`.
pub struct Body<T>(pub T);

impl<T, S> axum::extract::FromRequest<S> for Body<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state).await.map_err(|e| match e.status() {
            axum::http::StatusCode::PAYLOAD_TOO_LARGE => ApiError {
                status: e.status(),
                error: "payload_too_large",
                reason: "the request body is larger than http.max_body_size".into(),
            },
            _ => ApiError::bad_request(format!("cannot read the body: {e}")),
        })?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
        serde_json::from_slice(text).map(Body).map_err(|e| ApiError::bad_request(format!("bad JSON body: {e}")))
    }
}

/// Deserializers that take a value or its text, as RabbitMQ's API does (`rabbitmqadmin`
/// sends `"durable": "true"`, `"count": "1"`).
pub mod lenient {
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    fn as_bool(v: &Value) -> Option<bool> {
        match v {
            Value::Bool(b) => Some(*b),
            Value::String(s) => match s.as_str() {
                "true" => Some(true),
                "false" => Some(false),
                _ => None,
            },
            _ => None,
        }
    }

    fn as_u64(v: &Value) -> Option<u64> {
        match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// A boolean, or `"true"` / `"false"`.
    pub fn bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
        let v = Value::deserialize(d)?;
        as_bool(&v).ok_or_else(|| serde::de::Error::custom(format!("{v} is not a boolean")))
    }

    /// An optional boolean (`null` = none).
    pub fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        let v = Value::deserialize(d)?;
        if v.is_null() {
            return Ok(None);
        }
        as_bool(&v).map(Some).ok_or_else(|| serde::de::Error::custom(format!("{v} is not a boolean")))
    }

    /// A non-negative integer, or its text.
    pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let v = Value::deserialize(d)?;
        as_u64(&v).ok_or_else(|| serde::de::Error::custom(format!("{v} is not a non-negative integer")))
    }

    /// An optional non-negative integer (`null` = none).
    pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let v = Value::deserialize(d)?;
        if v.is_null() {
            return Ok(None);
        }
        as_u64(&v).map(Some).ok_or_else(|| serde::de::Error::custom(format!("{v} is not a non-negative integer")))
    }
}
